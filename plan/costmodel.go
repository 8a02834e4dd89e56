package plan

import (
	"fmt"
	"slices"
	"strings"

	"github.com/memfit/memfit/finetune"
)

// DeviceProfile is what the autopilot's cost model knows of the device a run is for: the sustained rate of the
// step's matrix products and of its elementwise passes over activations. The figures are documented constants
// (docs/autopilot.md says where each comes from); the cost model uses them when no timing is made: with
// --calibrate=false, when even the fast calibration's small model does not fit this machine, and when the run is
// for another backend (--for-backend).
type DeviceProfile struct {
	// Backend is the --for-backend name ("go", "xla:cuda", "xla:cuda:h200"); Device says what it stands for.
	Backend string `json:"backend"`
	Device  string `json:"device"`
	// FLOPs is the sustained floating-point operations per second of the step's matrix products (a fraction of
	// the device's peak: what a training step reaches).
	FLOPs float64 `json:"flops_per_second"`
	// Bytes is the sustained bytes per second of an elementwise pass over activations (read plus written).
	Bytes float64 `json:"elementwise_bytes_per_second"`
	// Restrict, when set, limits the block modes a plan made for this device from another backend may use (see
	// ModeRestriction): that plan's memory figures are the other backend's exact planner's, which may not hold on
	// this device.
	Restrict *ModeRestriction `json:"restrict,omitempty"`
}

// ModeRestriction limits the block modes of a plan made for a device from another backend to those measured to
// lower that device's peak, with why and how to lift the limit: the one place the limit lives (DeviceProfiles
// point at it).
type ModeRestriction struct {
	// Modes are the block modes such a plan may use (a subset of AutopilotModes).
	Modes []string `json:"modes"`
	// Reason is the measurement that set the limit; the autopilot prints it beside a plan it limited.
	Reason string `json:"reason"`
	// Lift says what would lift it.
	Lift string `json:"lift"`
}

// XLACUDAModes is the restriction of plans made for XLA CUDA from another backend (--for-backend xla:cuda on a
// laptop). On an H200 (docs/benchmarks/plancheck-h200: llama-1b LoRA all-linear, float32, batch 2 x 512, device
// peak bytes in use measured by bench step) approx-act lowered the peak (7.399 GiB against plain's 7.755 GiB),
// while Mesa (8.000 GiB) and gradient checkpointing (8.762 GiB) raised it, so a plan that used them passed the
// pure-Go planner and missed its budget on the GPU. That run predates issue 35's ordering ties (engine.Ties),
// which were made to let XLA keep what the planner counts; until a GPU run shows that they do, the limit stays.
// A plan made on the XLA backend itself is not limited: its memory figures are XLA's compiled sizes.
var XLACUDAModes = &ModeRestriction{
	Modes: []string{"plain", "approx-act"},
	Reason: "on XLA CUDA (an H200, docs/benchmarks/plancheck-h200) Mesa and gradient checkpointing raised the device peak " +
		"(measured before the ordering ties of issue 35; not yet measured with them)",
	Lift: "run bench/gpu/verify.sh --only memory on a GPU; when its memory-modes.json shows, with the ties, approx-act+mesa " +
		"below approx-act and grad-ckpt at or below 0.6x plain (llama-1b device peaks), set plan.XLACUDAModes to nil and cite the run",
}

// DeviceProfiles are the devices the cost model plans for (--for-backend). The go profile's rates were fitted on
// the 2-core build VM (AMD EPYC, GOEXPERIMENT=simd) at real sizes: plain's block time of llama-1b (LoRA
// all-linear, batch 2 x 512, float32: 1.18 s for 2 x 94.5 GFLOP, one- and two-block steps) gives the FLOP rate;
// Mesa's extra time the elementwise one (0.74 s for 4 x 71 MB there; 0.18-0.26 GB/s on the scaled ViT and LLaMA
// of docs/benchmarks/autopilot-cpu, whose smaller products also run below the FLOP rate: the cost model is for
// real sizes). The GPU profiles are the data-sheet peaks (H100 SXM: 989 TFLOP/s dense bfloat16, 3.35 TB/s HBM3;
// H200: 989 TFLOP/s, 4.8 TB/s HBM3e) times the fractions a transformer training step typically sustains: 40% of
// the matrix peak, 70% of the memory bandwidth.
var DeviceProfiles = []DeviceProfile{
	{Backend: "go", Device: "pure-Go backend on a 2-core x86 CPU (fitted on the build VM)", FLOPs: 160e9, Bytes: 0.3e9},
	{Backend: "xla:cuda", Device: "NVIDIA H100 SXM-class GPU (XLA CUDA)", FLOPs: 0.40 * 989e12, Bytes: 0.70 * 3.35e12, Restrict: XLACUDAModes},
	{Backend: "xla:cuda:h200", Device: "NVIDIA H200-class GPU (XLA CUDA)", FLOPs: 0.40 * 989e12, Bytes: 0.70 * 4.8e12, Restrict: XLACUDAModes},
}

// ProfileFor returns the device profile of a --for-backend name ("go", "xla:cuda", "xla:cuda:h200"; "xla" alone
// is xla:cuda), or an error naming the known ones.
func ProfileFor(backend string) (DeviceProfile, error) {
	name := strings.ToLower(strings.TrimSpace(backend))
	switch name {
	case "xla":
		name = "xla:cuda"
	case "go backend": // a Backend.Name()
		name = "go"
	}
	for _, p := range DeviceProfiles {
		if p.Backend == name {
			return p, nil
		}
	}
	var known []string
	for _, p := range DeviceProfiles {
		known = append(known, p.Backend)
	}
	return DeviceProfile{}, fmt.Errorf("--for-backend %q: the cost model knows %s (a device profile each: docs/autopilot.md); give one of them",
		backend, strings.Join(known, ", "))
}

// Cost model coefficients: the bytes an elementwise pass moves per byte of saved activation it touches.
const (
	// approxPassBytes: approx-act packs the activation function's 2-bit code in the same pass that applies it,
	// and the backward reads the code instead of the input: no bytes moved beyond plain's. Measured within the
	// noise of plain (0.92-1.04x of the ms-norm step on the scaled ViT and LLaMA, docs/benchmarks/autopilot-cpu).
	approxPassBytes = 0
	// mesaPassBytes: Mesa reads each tensor it quantises (and its absolute maximum), writes the 8-bit copy,
	// and the backward reads it and writes the dequantised tensor: about 4 bytes moved per byte no longer kept.
	mesaPassBytes = 4
	// dequantBytes: QLoRA dequantises each NF4 weight (half a byte read, a bfloat16 written) once more when
	// gradient checkpointing recomputes a block.
	dequantBytes = 2.5
)

// BlockWork is what the cost model reads of one transformer block at the planned shape: its forward FLOPs
// (finetune.BlockFLOPs), its saved activations in plain (the exact planner's, divided by the blocks) and the
// NF4 weights it dequantises (QLoRA; 0 otherwise).
type BlockWork struct {
	ForwardFLOPs   float64 `json:"forward_flops"`
	SavedBytes     float64 `json:"saved_bytes_plain"`
	QuantizedElems float64 `json:"quantized_params,omitempty"`
	// Backward is the backward pass's FLOPs as a multiple of the forward's: 1 for adapters (frozen weights
	// need the input gradient only), 2 for full fine-tuning.
	Backward float64 `json:"backward_factor"`
}

// CostModel sets each mode's StepSeconds from the device profile, without timing. For one block, with F its
// forward FLOPs, a_o the saved activation bytes of mode o (the exact planner's, per block), Q its NF4 weights,
// R the profile's FLOP rate and W its elementwise bandwidth:
//
//	plain:            t_plain  = (1 + backward) F / R                 (backward: 1 for adapters, 2 for full)
//	approx-act:       t_approx = t_plain                              (2-bit codes packed in the activation's
//	                                                                    own pass, read instead of its input)
//	approx-act+mesa:  t_approx + 4 (a_approx - a_mesa) / W             (8-bit copies made, then read back)
//	grad-ckpt:        t_plain + F / R + 2.5 Q / W                      (the forward recomputed; QLoRA's NF4
//	                                                                    weights dequantised once more)
//
// and a mode's StepSeconds is blocks x its block time (the part outside the blocks is the same in every mode and
// left out: the predicted step is the blocks' share). The saved bytes a_o are what the exact planner reads off
// each mode's training graph, so the bytes a mode stops keeping are the bytes its extra passes move. Costs must
// start with plain and carry SavedBytes.
func CostModel(costs []ModeCost, blocks int, w BlockWork, p DeviceProfile) error {
	if len(costs) == 0 || costs[0].Mode != "plain" || blocks <= 0 {
		return fmt.Errorf("cost model: the costs must start with plain, for a model with blocks")
	}
	per := func(c ModeCost) float64 { return float64(c.SavedBytes) / float64(blocks) }
	find := func(mode string) (float64, bool) {
		i := slices.IndexFunc(costs, func(c ModeCost) bool { return c.Mode == mode })
		if i < 0 {
			return 0, false
		}
		return per(costs[i]), true
	}
	aPlain := per(costs[0])
	plain := (1 + w.Backward) * w.ForwardFLOPs / p.FLOPs
	approx := func() float64 {
		a, _ := find("approx-act")
		return plain + approxPassBytes*max(0, aPlain-a)/p.Bytes
	}
	for i := range costs {
		var t float64
		switch costs[i].Mode {
		case "plain":
			t = plain
		case "approx-act":
			t = approx()
		case "approx-act+mesa":
			a, ok := find("approx-act")
			if !ok {
				a = aPlain
			}
			t = approx() + mesaPassBytes*max(0, a-per(costs[i]))/p.Bytes
		case "grad-ckpt":
			t = plain + w.ForwardFLOPs/p.FLOPs + dequantBytes*w.QuantizedElems/p.Bytes
		default:
			return fmt.Errorf("cost model: no cost for mode %q", costs[i].Mode)
		}
		costs[i].StepSeconds = float64(blocks) * t
		costs[i].StepMin, costs[i].StepMax = 0, 0
	}
	return nil
}

// blockWork returns the cost model's figures of one of model's blocks at shape in: its forward FLOPs, plain's
// saved activations per block (from costs[0]) and, for QLoRA, its NF4 weights.
func blockWork(model finetune.Model, cfg finetune.Config, in finetune.Shape, costs []ModeCost, blocks int) (BlockWork, error) {
	if _, pairs := cfg.Preference(); pairs {
		in.Batch *= 2 // a preference step's policy runs the chosen and the rejected sequences: 2B of them
	}
	f, err := finetune.BlockFLOPs(model, in)
	if err != nil {
		return BlockWork{}, err
	}
	w := BlockWork{ForwardFLOPs: f, SavedBytes: float64(costs[0].SavedBytes) / float64(blocks), Backward: 1}
	if cfg.Method == finetune.MethodFull {
		w.Backward = 2
	}
	if cfg.Method == finetune.MethodQLoRA {
		for _, l := range model.LinearLayers() {
			if !l.Head {
				w.QuantizedElems += float64(l.In) * float64(l.Out)
			}
		}
		w.QuantizedElems /= float64(blocks)
	}
	return w, nil
}
