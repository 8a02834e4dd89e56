package bench

import (
	"fmt"
	_ "github.com/memfit/memfit/family/all" // the shipped model families register themselves
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
)

// StepResult is one configuration's training-step figures, as `finetune bench step` prints them (and as
// bench/pytorch/peft_compare.py prints the PyTorch side's).
type StepResult struct {
	TimedCell
	Backend string `json:"backend"`
	Batch   int    `json:"batch"`
	Seq     int    `json:"seq,omitempty"`
	Compute string `json:"compute_dtype"`
	// BlockPlan is the per-block memory plan the step ran with ("" for the variant alone).
	BlockPlan string `json:"block_plan,omitempty"`
	// DevicePeakBytes is the device's peak bytes in use over the whole process (memory.XLADeviceStats), on XLA
	// only; DevicePeakMethod says how it was measured.
	DevicePeakBytes  int64  `json:"device_peak_bytes,omitempty"`
	DevicePeakMethod string `json:"device_peak_method,omitempty"`
}

// PresetCheckpoint writes a random-weight bfloat16 checkpoint of a memfit preset ("vit-b16", "llama-7b", "vit:tiny",
// "llama:tiny", ...) into a sub-folder of dir named after it, with labels classes for a ViT (a causal LM for a
// LLaMA), and returns that folder; one written there before (same seed, same weights) is reused. A name that is an
// existing folder is returned as it is.
func PresetCheckpoint(name string, labels int, dir string) (string, error) {
	if st, err := os.Stat(name); err == nil && st.IsDir() {
		return name, nil
	}
	arch, preset, ok := strings.Cut(name, ":")
	if !ok {
		switch {
		case strings.HasPrefix(name, "vit"):
			arch, preset = "vit", name
		case strings.HasPrefix(name, "llama"):
			arch, preset = "llama", name
		default:
			return "", fmt.Errorf("model %q is neither a folder nor a preset (vit-b16, llama-1b, llama-7b, vit:tiny, llama:tiny, ...)", name)
		}
	}
	if arch == "llama" {
		labels = 0
	}
	out := filepath.Join(dir, strings.ReplaceAll(name, ":", "-"))
	if _, err := os.Stat(filepath.Join(out, "config.json")); err == nil {
		return out, nil // written by an earlier run into the same folder (the weights are seeded: the same)
	}
	// Stored as bfloat16, as Hugging Face checkpoints usually are (a llama-7b file of 13.5 GB instead of 27 GB).
	if err := finetune.InitModel(arch, preset, labels, 1, out, 4<<30, "bfloat16"); err != nil {
		return "", err
	}
	return out, nil
}

// RunStep trains one model x method x variant for steps timed steps after a warm-up (TimeGrid with one cell) and
// adds, on XLA, the device's peak bytes in use. Run one configuration per process when the device peak matters:
// it is the peak since the backend started.
func RunStep(backend compute.Backend, dir string, shape finetune.Shape, base finetune.Config, method GridMethod, variant finetune.Variant, steps int, log io.Writer) (StepResult, error) {
	tm := TimedModel{Name: filepath.Base(dir), Dir: dir, Shape: shape, Base: base}
	cells, err := TimeGrid(backend, []TimedModel{tm}, []GridMethod{method}, []finetune.Variant{variant}, steps, log)
	if err != nil {
		return StepResult{}, err
	}
	r := StepResult{TimedCell: cells[0], Backend: backend.Name(), Batch: shape.Batch, Seq: shape.Seq, Compute: base.ComputeDType, BlockPlan: base.BlockPlan}
	if st, err := memory.XLADeviceStats(backend, 0); err == nil && st.Peak >= 0 {
		r.DevicePeakBytes, r.DevicePeakMethod = st.Peak, string(memory.MethodXLADevice)
	}
	return r, nil
}

// GridMethodByName returns the grid method called name.
func GridMethodByName(name string) (GridMethod, error) {
	for _, m := range GridMethods {
		if m.Name == name {
			return m, nil
		}
	}
	names := make([]string, len(GridMethods))
	for i, m := range GridMethods {
		names[i] = m.Name
	}
	return GridMethod{}, fmt.Errorf("unknown method %q: use one of %s", name, strings.Join(names, ", "))
}
