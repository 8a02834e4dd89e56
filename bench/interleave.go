package bench

import (
	"fmt"
	"time"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/finetune"
)

// CPUInterleaved is memfit's variants of one case trained in one process, step by step in turn (plain, approx,
// plain, approx, ...): their step-time ratio then sees the same machine at the same moments, which separate
// processes on a shared host do not (a single process's median moved by up to a fifth between runs on the build
// VM, more than the differences being measured).
type CPUInterleaved struct {
	Case     string   `json:"case"`
	Variants []string `json:"variants"`
	Warmup   int      `json:"warmup"`
	// StepSeconds[i] are variant i's timed steps, in turn order; MedianSeconds[i] their median.
	StepSeconds   [][]float64 `json:"step_seconds"`
	MedianSeconds []float64   `json:"median_step_seconds"`
	// RatioToFirst[i] is the median over the turns of variant i's step over the first variant's step in the same
	// turn.
	RatioToFirst []float64 `json:"ratio_to_first"`
}

// RunCPUInterleaved trains case c of the spec's settings in every variant (trainers built side by side on one
// backend, the same batch), for the settings' warm-up steps and then its timed steps, one step of each variant
// in turn.
func RunCPUInterleaved(backend compute.Backend, spec CPUSpec, variants []string) (CPUInterleaved, error) {
	s := spec.Settings
	r := CPUInterleaved{Case: spec.Case.Tag(), Variants: variants, Warmup: s.Warmup}
	if err := s.Validate(); err != nil {
		return r, err
	}
	if len(variants) < 2 {
		return r, fmt.Errorf("interleaving needs at least two variants, got %d", len(variants))
	}
	batch, err := ReadCPUBatch(spec.BatchFile)
	if err != nil {
		return r, err
	}
	trainers := make([]*finetune.Trainer, len(variants))
	for i, v := range variants {
		cfg, err := s.Config(spec.Case, v)
		if err != nil {
			return r, err
		}
		model, err := finetune.LoadModel(spec.Case.Model, cfg)
		if err != nil {
			return r, err
		}
		if trainers[i], err = finetune.New(model, cfg, backend); err != nil {
			return r, fmt.Errorf("%s: %w", v, err)
		}
	}
	r.StepSeconds = make([][]float64, len(variants))
	for step := range s.Warmup + s.Steps {
		for i, tr := range trainers {
			start := time.Now()
			if _, err := tr.TrainStep([]finetune.Batch{batch}); err != nil {
				return r, fmt.Errorf("%s step %d: %w", variants[i], step+1, err)
			}
			if step >= s.Warmup {
				r.StepSeconds[i] = append(r.StepSeconds[i], time.Since(start).Seconds())
			}
		}
	}
	for i := range variants {
		r.MedianSeconds = append(r.MedianSeconds, median(r.StepSeconds[i]))
		ratios := make([]float64, len(r.StepSeconds[i]))
		for k, d := range r.StepSeconds[i] {
			ratios[k] = d / r.StepSeconds[0][k]
		}
		r.RatioToFirst = append(r.RatioToFirst, median(ratios))
	}
	return r, nil
}
