// Package plan is memfit's memory planner: what a training step will hold, from the model's config alone
// (Step, Memory), the largest batch or sequence that fits a budget (Capacities), whether a run fits this machine
// (CheckMachine), how long its programs take to compile (TimeCompile), and the memory autopilot, which chooses
// the per-block plan that fits a budget and runs fastest (Autopilot). It builds its steps with package finetune
// (finetune.StepShapes) and plugs into its recipe (finetune.Recipe) through function values; finetune does not
// import it.
package plan

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/quant"
)

// StepMemory is the memory of one training step in one variant.
type StepMemory struct {
	Name string `json:"name"`
	// SavedActivationBytes is exact (MethodSaved): the forward tensors the backward pass reads, from the
	// training graph; SavedByKind splits it by op kind (linear, norm, activation, attention, other).
	SavedActivationBytes int64            `json:"saved_activation_bytes"`
	SavedByKind          map[string]int64 `json:"saved_by_kind"`
	SavedMethod          string           `json:"saved_method"`
	// PeakBytes is the peak memory of the gradient step (its inputs, i.e. weights and batch, included);
	// PeakMethod says how it was obtained.
	PeakBytes  int64  `json:"peak_bytes"`
	PeakMethod string `json:"peak_method"`
	// WeightsBytes are the model and adapter tensors as the step holds them (frozen ones in the compute dtype,
	// trainable ones in float32); GradientBytes the trainable tensors' gradients (float32); OptimizerBytes the
	// optimizer state (float32; two moments for AdamW, one buffer for SGD).
	WeightsBytes   int64 `json:"weights_bytes"`
	GradientBytes  int64 `json:"gradient_bytes"`
	OptimizerBytes int64 `json:"optimizer_bytes"`
	// TotalBytes is PeakBytes + OptimizerBytes: the step's peak with the optimizer state, which stays resident
	// across steps, added.
	TotalBytes      int64 `json:"total_bytes"`
	TrainableParams int64 `json:"trainable_params"`
	// QuantizedParams and QuantizedBytes count the NF4 weights (qlora): parameters and their storage (codes,
	// double-quantised scales, folded-norm column scales); QuantizedBits is the bits per quantised parameter.
	QuantizedParams int64   `json:"quantized_params,omitempty"`
	QuantizedBytes  int64   `json:"quantized_bytes,omitempty"`
	QuantizedBits   float64 `json:"quantized_bits_per_param,omitempty"`
	// SavedRatio, PeakRatio and TotalRatio compare with the first variant of the report (plain).
	SavedRatio float64 `json:"saved_ratio"`
	PeakRatio  float64 `json:"peak_ratio"`
	TotalRatio float64 `json:"total_ratio"`
	// BesidePeakBytes, BesidePeakMethod and BesideTotalBytes are the same step planned on the report's Beside
	// backend (MemoryRequest.Beside: the pure-Go planner's accounting, printed beside XLA's compiled sizes), with
	// BesidePeakRatio its peak against the first variant's there; zero when there is none.
	BesidePeakBytes  int64   `json:"beside_peak_bytes,omitempty"`
	BesidePeakMethod string  `json:"beside_peak_method,omitempty"`
	BesideTotalBytes int64   `json:"beside_total_bytes,omitempty"`
	BesidePeakRatio  float64 `json:"beside_peak_ratio,omitempty"`
}

// Report compares the variants of one training configuration.
type Report struct {
	Model        string         `json:"model"`
	ModelType    string         `json:"model_type"`
	Method       string         `json:"method"`
	Objective    string         `json:"objective,omitempty"`
	ComputeDType string         `json:"compute_dtype"`
	Attention    string         `json:"attention"`
	Shape        finetune.Shape `json:"shape"`
	Backend      string         `json:"backend"`
	// Beside is the backend each variant was also planned on (MemoryRequest.Beside), or "".
	Beside   string       `json:"beside,omitempty"`
	Variants []StepMemory `json:"variants"`
	// Ties says whether the steps were built with engine's ordering ties (engine.Ties; MEMFIT_XLA_TIES=0 turns
	// them off for a before/after comparison on XLA).
	Ties bool `json:"ties"`
}

// ShapeModel returns the model at dir (a Hugging Face folder: only config.json is read) or, when dir is not a
// folder, the named preset, as "arch:name" or just the name when only one architecture has it (vit: "tiny",
// "vit-b16" with labels classes, 0 for the bare ViTModel; llama: "tiny", "llama-1b", "llama-7b", a causal LM
// when labels is 0), built in cfg's modes without any weights: enough to build training graphs, not to run them.
// It also returns the checkpoint's parameter shapes after folding (finetune.ParamShapes).
func ShapeModel(dir string, cfg finetune.Config, labels int) (finetune.Model, map[string][]int, error) {
	opts, err := finetune.ModelOptionsOf(cfg)
	if err != nil {
		return nil, nil, err
	}
	var model finetune.Model
	if st, statErr := os.Stat(dir); statErr == nil && st.IsDir() {
		fam, err := finetune.FamilyOfFolder(dir)
		if err != nil {
			return nil, nil, err
		}
		if fam.Shaped == nil {
			return nil, nil, fmt.Errorf("model type %q cannot be planned", fam.Name)
		}
		if model, err = fam.Shaped(dir, opts); err != nil {
			return nil, nil, err
		}
	} else {
		arch, name, qualified := strings.Cut(dir, ":")
		if !qualified {
			arch, name = "", dir
		}
		var have, qualifiedNames, lists []string
		for _, fam := range finetune.Families() {
			if fam.Preset == nil {
				continue
			}
			lists = append(lists, fmt.Sprintf("%s: %s", fam.Name, strings.Join(fam.Presets, ", ")))
			if arch != "" && arch != fam.Name {
				continue
			}
			m, err := fam.Preset(name, labels, opts)
			if err != nil {
				continue
			}
			model = m
			have, qualifiedNames = append(have, fam.Name), append(qualifiedNames, fam.Name+":"+name)
		}
		switch {
		case len(have) > 1:
			return nil, nil, fmt.Errorf("preset %q exists for %s: write %s", name, strings.Join(have, " and "), strings.Join(qualifiedNames, " or "))
		case len(have) == 1:
		case statErr != nil && !os.IsNotExist(statErr):
			return nil, nil, statErr
		default:
			return nil, nil, fmt.Errorf("%s is neither a model folder nor a preset (%s)", dir, strings.Join(lists, "; "))
		}
	}
	if err := finetune.ApplyBlockPlan(model, cfg); err != nil {
		return nil, nil, err
	}
	return model, finetune.ParamShapes(model, cfg), nil
}

// MaxSeq is the longest sequence the planner plans for: building a step allocates host constants sized by the
// sequence (RoPE tables), so a typo such as --seq 100000000 must stop here rather than exhaust the machine.
const MaxSeq = 1 << 20

// Step builds (without running it) the gradient step of cfg on model, whose parameters have the given shapes,
// for a batch of the given shape, and returns its memory: saved activations read off the graph, the step's peak
// (simulated for the pure-Go backend, compiled-program sizes for XLA), weights, gradients and optimizer bytes.
func Step(backend compute.Backend, model finetune.Model, paramShapes map[string][]int, cfg finetune.Config, in finetune.Shape) (StepMemory, error) {
	step, err := gradientStep(backend, model, paramShapes, cfg, in)
	if err != nil {
		return StepMemory{}, err
	}
	defer step.Graph.Finalize()
	return figures(step, model, cfg)
}

// gradientStep builds and compiles Step's gradient step (without running it).
func gradientStep(backend compute.Backend, model finetune.Model, paramShapes map[string][]int, cfg finetune.Config, in finetune.Shape) (*finetune.ShapedStep, error) {
	s, err := stepShapes(model, paramShapes, cfg, in)
	if err != nil {
		return nil, err
	}
	return s.GradientStep(backend)
}

// stepShapes describes the step of cfg on model for a batch of shape in, checking what the finetune step itself
// does not: the batch size and the sequence length.
func stepShapes(model finetune.Model, paramShapes map[string][]int, cfg finetune.Config, in finetune.Shape) (finetune.StepShapes, error) {
	fail := func(err error) (finetune.StepShapes, error) { return finetune.StepShapes{}, err }
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	if in.Batch <= 0 {
		return fail(fmt.Errorf("batch size must be positive, got %d", in.Batch))
	}
	if err := finetune.CheckTrainable(model); err != nil {
		return fail(err)
	}
	fam, ok := finetune.FamilyOf(model)
	if !ok || fam.BatchShapes == nil {
		return fail(fmt.Errorf("memory planning does not know model %T", model))
	}
	if fam.Sequence && (in.Seq <= 0 || in.Seq > MaxSeq) {
		return fail(fmt.Errorf("a %s step plan needs a sequence length from 1 to %d tokens (got %d)", fam.Title, MaxSeq, in.Seq))
	}
	batch, err := finetune.StepBatchShapes(model, cfg, in)
	if err != nil {
		return fail(err)
	}
	return finetune.StepShapes{Model: model, Params: paramShapes, Config: cfg, Batch: batch}, nil
}

// figures reads the memory figures of Step off its compiled gradient step.
func figures(step *finetune.ShapedStep, model finetune.Model, cfg finetune.Config) (StepMemory, error) {
	g := step.Graph
	backend := g.Backend()
	saved, err := memory.Saved(g, step.Outputs...)
	if err != nil {
		return StepMemory{}, err
	}
	var peak memory.Peak
	if backend.Name() == "xla" {
		peak, err = memory.XLAProgramPeak(g)
	} else {
		peak, err = memory.SimulatePeak(g, memory.SimOptions{})
	}
	if err != nil {
		return StepMemory{}, err
	}
	v := StepMemory{SavedActivationBytes: saved.Total, SavedByKind: map[string]int64{}, SavedMethod: memory.MethodSavedWalk,
		PeakBytes: peak.Bytes, PeakMethod: string(peak.Method)}
	for _, k := range engine.Kinds {
		v.SavedByKind[k.String()] = saved.ByKind[k]
	}
	for name, s := range step.Frozen {
		v.WeightsBytes += int64(s.Memory())
		if quant.IsNF4Tensor(name) {
			v.QuantizedBytes += int64(s.Memory())
		}
	}
	if v.QuantizedBytes > 0 {
		for _, l := range model.LinearLayers() {
			if !l.Head {
				v.QuantizedParams += int64(l.Out) * int64(l.In)
			}
		}
		v.QuantizedBits = 8 * float64(v.QuantizedBytes) / float64(v.QuantizedParams)
	}
	moments := int64(2)
	if cfg.Optimizer == "sgd" {
		moments = 1
	}
	for _, s := range step.Train {
		b := int64(s.Memory())
		v.WeightsBytes += b
		v.GradientBytes += b
		v.OptimizerBytes += moments * b
		v.TrainableParams += int64(s.Size())
	}
	v.TotalBytes = v.PeakBytes + v.OptimizerBytes
	return v, nil
}

// MemoryRequest is what Memory compares: a model (a folder or a preset name, see ShapeModel, with Labels classes
// for a preset's classifier head), trained with Config, at a batch Shape, in each of Variants
// (finetune.Variants when empty).
type MemoryRequest struct {
	Model    string
	Config   finetune.Config
	Labels   int
	Shape    finetune.Shape
	Variants []finetune.Variant
	// Beside, when not nil, is a second backend every variant is also planned on, its figures reported beside
	// (StepMemory.Beside*): finetune memory on XLA passes the pure-Go backend, so that XLA's compiled sizes and
	// the pure-Go planner's accounting (what a plan made on a laptop counts) print side by side.
	Beside compute.Backend
	// Progress, when not nil, receives a line before each variant is planned (a large model's step takes many
	// seconds to build and plan in each) and when all are done.
	Progress func(line string)
}

// Memory plans the request's training step in every variant and returns them side by side, with ratios to the
// first.
func Memory(backend compute.Backend, r MemoryRequest) (*Report, error) {
	variants := r.Variants
	if len(variants) == 0 {
		variants = finetune.Variants
	}
	cfg := r.Config
	rep := &Report{Model: r.Model, Method: cfg.Method, Objective: cfg.Objective, ComputeDType: cfg.ComputeDType, Attention: cfg.Attention,
		Shape: r.Shape, Backend: backend.Name(), Ties: engine.Ties()}
	if r.Beside != nil {
		rep.Beside = r.Beside.Name()
	}
	start := time.Now()
	for i, v := range variants {
		if r.Progress != nil {
			r.Progress(fmt.Sprintf("memory: planning %s (variant %d of %d, %.0f s so far)", v.Name, i+1, len(variants), time.Since(start).Seconds()))
		}
		vc := v.Apply(cfg)
		model, shp, err := ShapeModel(r.Model, vc, r.Labels)
		if err != nil {
			return nil, err
		}
		fam, _ := finetune.FamilyOf(model)
		rep.ModelType = fam.Name
		if !fam.Sequence {
			rep.Shape.Seq = 0
		}
		mv, err := Step(backend, model, shp, vc, r.Shape)
		if err != nil {
			return nil, fmt.Errorf("variant %s: %w", v.Name, err)
		}
		mv.Name = v.Name
		if r.Beside != nil {
			bv, err := Step(r.Beside, model, shp, vc, r.Shape)
			if err != nil {
				return nil, fmt.Errorf("variant %s on %s: %w", v.Name, r.Beside.Name(), err)
			}
			mv.BesidePeakBytes, mv.BesidePeakMethod, mv.BesideTotalBytes = bv.PeakBytes, bv.PeakMethod, bv.TotalBytes
		}
		rep.Variants = append(rep.Variants, mv)
	}
	if r.Progress != nil {
		r.Progress(fmt.Sprintf("memory: %d variants planned in %.1f s", len(variants), time.Since(start).Seconds()))
	}
	base := rep.Variants[0]
	for i := range rep.Variants {
		v := &rep.Variants[i]
		v.SavedRatio = ratio(v.SavedActivationBytes, base.SavedActivationBytes)
		v.PeakRatio = ratio(v.PeakBytes, base.PeakBytes)
		v.TotalRatio = ratio(v.TotalBytes, base.TotalBytes)
		v.BesidePeakRatio = ratio(v.BesidePeakBytes, base.BesidePeakBytes)
	}
	return rep, nil
}

// hasSequence reports whether m's family has a sequence length to choose (LLaMA; a ViT's is its image size).
func hasSequence(m finetune.Model) bool {
	fam, ok := finetune.FamilyOf(m)
	return ok && fam.Sequence
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
