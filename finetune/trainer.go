package finetune

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/runner"
)

// Trainer trains a model: it owns the trainable parameters (float32 master copies), the frozen ones, the
// optimizer state and the step count.
type Trainer struct {
	Config  Config
	Model   Model
	Backend compute.Backend
	// Adapters are the LoRA adapters (nil for full fine-tuning).
	Adapters *adapter.Set

	// Train holds the trainable tensors (adapter tensors named "<module path>.<suffix>" and trained base
	// parameters by their names), float32.
	Train models.Params
	// Frozen holds the other tensors, in the compute dtype.
	Frozen models.Params
	// M and V are the optimizer state of each trainable tensor (AdamW moments; SGD uses M as the momentum
	// buffer).
	M, V models.Params
	// Step counts the optimizer steps done.
	Step int
	// RNG is the random-number state of the training steps (dropout), advanced by every micro-batch.
	RNG *tensors.Tensor
	// Mesa holds the running int8 ranges of the Mesa-stored activations ([groups, 3]: min, max, initialised),
	// updated by every micro-batch and saved in checkpoints.
	Mesa []*tensors.Tensor

	// Compiles counts the step programs built and compiled so far (one per batch shape and micro-batch role).
	Compiles int

	programs       map[string]*stepProgram
	compileSeconds float64
	// owned holds the tensors the trainer's programs produced and nobody else holds: they are donated to the
	// next program that consumes them.
	owned map[*tensors.Tensor]struct{}
	// ok is the device-side "no step has failed" flag (nil: true); pending the steps whose loss and norm have
	// not been read; lastLoss and lastNorm the last figures read.
	ok                 *tensors.Tensor
	pending            []pendingStep
	lastLoss, lastNorm float64
	lastMetrics        map[string]float64
	// ref is how a DPO run's steps compute the reference model, refStart the starting values (float32) of the
	// tensors it keeps frozen copies of, by their copies' names (objective.go).
	ref      reference
	refStart models.Params
	// initAdapter is where the next checkpoint takes its copy of the init_adapter (nil without one).
	initAdapter *initAdapterSource

	// Validation is the validation set Fit evaluates (nil: none; see evaluate.go) and EvalState where its
	// evaluations stand (saved in checkpoints).
	Validation EvalSet
	EvalState  EvalState
	evalRunner *runner.OutputsRunner
	// evalIdentity is Validation's identity (saved in checkpoints); resumedEval the resumed checkpoint's, until
	// CheckValidationSet has compared them.
	evalIdentity, resumedEval *evalSetIdentity
	// resumedFrom is the checkpoint folder Resume read ("" for a new run).
	resumedFrom string
}

// StepStats describes one optimizer step.
type StepStats struct {
	Step     int     `json:"step"`
	Loss     float64 `json:"loss"`
	LR       float64 `json:"lr"`
	GradNorm float64 `json:"grad_norm"`
	// Examples and Tokens processed (tokens: real tokens of text batches, from attention_mask or input_ids; a
	// batch of packed sequences counts the examples packed into it, not its rows).
	Examples int `json:"examples"`
	Tokens   int `json:"tokens,omitempty"`
	// Seconds is the wall time of the step (gradient computations and the update), without CompileSeconds. On a
	// backend that runs programs asynchronously (XLA) a step that was not synced only queued its work: the
	// next synced step's Seconds includes the wait, so the sum over steps is right.
	Seconds float64 `json:"seconds"`
	// CompileSeconds is the time this step spent building and compiling step programs (the first step, and a
	// step with a new batch shape).
	CompileSeconds float64 `json:"compile_seconds,omitempty"`
	// ExamplesPerSecond and TokensPerSecond are the step's throughput (tokens for text batches only).
	ExamplesPerSecond float64 `json:"examples_per_second"`
	TokensPerSecond   float64 `json:"tokens_per_second,omitempty"`
	// SavedActivationBytes is the exact saved-activation size of the gradient step (training-graph walk).
	SavedActivationBytes int64 `json:"saved_activation_bytes"`
	// PeakBytes is the peak memory of the gradient step and PeakMethod how it was obtained. A peak that could not
	// be obtained (memory.UnavailablePeak: say, a compute version the Go backend's executor model was not
	// written for) has PeakBytes 0 and PeakMethod "unavailable: <reason>", also in metrics.jsonl; print it with
	// memory.FormatPeak, never as 0 B.
	PeakBytes  int64  `json:"peak_bytes"`
	PeakMethod string `json:"peak_method"`
	// SkippedBatches counts the batches without a target token that Fit has skipped so far (Hooks.OnSkip).
	SkippedBatches int `json:"skipped_batches,omitempty"`
	// Metrics are the objective's own figures of the step (a preference objective's rewards/chosen,
	// logps/chosen, ... as TRL logs them: means over the step's pairs), read back with Loss; in metrics.jsonl they
	// are keys of the step's line.
	Metrics map[string]float64 `json:"-"`
	// Synced says whether Loss and GradNorm were read back for this step (TrainStep, and Fit at its logging,
	// checkpoint and last steps); otherwise they are zero and still on the backend.
	Synced bool `json:"-"`
}

// TrainStep runs one optimizer step over the micro-batches (gradient accumulation: the gradients are averaged
// over them; pass Config.AccumSteps batches) and waits for its loss and gradient norm. On a non-finite loss or
// gradient norm it returns an error wrapping ErrNonFinite and changes nothing. TrainStepAsync followed by Sync,
// in one call.
func (t *Trainer) TrainStep(batches []Batch) (StepStats, error) {
	start := time.Now()
	stats, err := t.TrainStepAsync(batches)
	if err != nil || stats.Synced {
		return stats, err
	}
	if stats.Loss, stats.GradNorm, err = t.Sync(); err != nil {
		return stats, err
	}
	stats.Synced, stats.Metrics = true, t.lastMetrics
	stats.setSeconds(time.Since(start).Seconds() - stats.CompileSeconds)
	return stats, nil
}

// TrainStepAsync runs one optimizer step over the micro-batches on the backend and returns without reading
// anything back (see the device-resident step in devicestep.go): the stats have no Loss or GradNorm (Synced is
// false; Sync reads them), and a non-finite step is reported by the next Sync. Step counts the step at once.
func (t *Trainer) TrainStepAsync(batches []Batch) (StepStats, error) {
	if len(batches) == 0 {
		return StepStats{}, fmt.Errorf("no batches for the step")
	}
	if c, ok := t.Model.(runner.BatchChecker); ok {
		for _, b := range batches {
			if err := checkModelBatch(c.CheckBatch, b); err != nil {
				return StepStats{}, fmt.Errorf("batch for step %d: %w", t.Step+1, err)
			}
		}
	}
	start := time.Now()
	compiled := t.compileSeconds
	stats := StepStats{Step: t.Step + 1, LR: t.Config.LearningRate(t.Step)}
	if len(t.pending) >= maxPending {
		// Bounded: a caller that never syncs holds at most maxPending steps' scalars.
		if _, _, err := t.Sync(); err != nil {
			return stats, err
		}
	}
	if err := t.deviceStep(batches, &stats); err != nil {
		return stats, err
	}
	stats.CompileSeconds = t.compileSeconds - compiled
	stats.setSeconds(time.Since(start).Seconds() - stats.CompileSeconds)
	return stats, nil
}

// maxPending is the most steps TrainStepAsync runs without reading their loss back; the next one syncs first.
const maxPending = 1000

// setSeconds sets the step's time and throughputs.
func (s *StepStats) setSeconds(sec float64) {
	s.Seconds = sec
	s.ExamplesPerSecond = float64(s.Examples) / sec
	s.TokensPerSecond = float64(s.Tokens) / sec
}

// ErrNonFinite is returned when a loss or gradient norm is NaN or infinite; the parameters are left as they
// were before the step.
var ErrNonFinite = errors.New("non-finite loss")

// Option changes how New sets a trainer up.
type Option func(*options)

type options struct {
	adapters *adapter.Set
	// initFrom is the checkpoint's copy of the init_adapter that Resume reads instead of the config's folder.
	initFrom string
	// legacyInit resumes a checkpoint written before runs kept their init adapter: its lora_targets are the
	// defaults the run then ignored, not the adapter's layers, so they are not checked.
	legacyInit bool
}

// WithAdapters trains the given adapters (any adapter.Adapter implementations, e.g. a custom one) instead of
// creating LoRA adapters; use it with Config.Method "custom".
func WithAdapters(set *adapter.Set) Option { return func(o *options) { o.adapters = set } }

// New prepares training of model with cfg on backend: adapters are created and initialised from cfg.Seed
// (lora, lora-fa) or taken from WithAdapters (custom), trainable tensors are chosen, the frozen ones converted
// to the compute dtype, and the optimizer state zeroed. A config with a block_plan sets the model's per-block
// options (ViT, Llama) to it.
func New(model Model, cfg Config, backend compute.Backend, opts ...Option) (*Trainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := CheckTrainable(model); err != nil {
		return nil, err
	}
	if err := ApplyBlockPlan(model, cfg); err != nil {
		return nil, err
	}
	if (cfg.Method == MethodCustom) != (o.adapters != nil) {
		return nil, fmt.Errorf("method custom and WithAdapters go together (method %q)", cfg.Method)
	}
	t := &Trainer{Config: cfg, Model: model, Backend: backend, Train: models.Params{}, Frozen: models.Params{},
		M: models.Params{}, V: models.Params{}, programs: map[string]*stepProgram{},
		owned: map[*tensors.Tensor]struct{}{}}
	params := model.Params()
	if cfg.Method == MethodCustom {
		t.Adapters = o.adapters
	} else if newAdapter, err := newAdapters(cfg); err != nil {
		return nil, err
	} else if newAdapter != nil {
		if cfg.InitAdapter != "" {
			src := &initAdapterSource{dir: cfg.InitAdapter}
			if o.initFrom != "" {
				src = &initAdapterSource{dir: o.initFrom, ours: true} // resumed: the checkpoint's copy
			}
			if src.sums, err = readInitAdapterSums(src.dir); err != nil {
				return nil, err
			}
			peft, err := ReadAdapter(src.dir, model)
			if err != nil {
				return nil, err
			}
			saved, err := lora.FromPEFT(peft.Config)
			if err != nil {
				return nil, fmt.Errorf("init_adapter %s: %w", cfg.InitAdapter, err)
			}
			if saved.Rank != cfg.LoRARank || saved.Alpha != cfg.LoRAAlpha || saved.RSLoRA != cfg.RSLoRA {
				return nil, fmt.Errorf("init_adapter %s has r=%d, alpha=%g, rslora=%v but the config says %d, %g, %v: leave lora_r, lora_alpha and rslora out, the adapter sets them",
					cfg.InitAdapter, saved.Rank, saved.Alpha, saved.RSLoRA, cfg.LoRARank, cfg.LoRAAlpha, cfg.RSLoRA)
			}
			if !o.legacyInit {
				if err := sameTargets(model, cfg, peft.Set); err != nil {
					return nil, err
				}
			}
			// The adapter's ranks and alphas (with its rank_pattern and alpha_pattern), the config's dropout and
			// frozen A.
			saved.Dropout, saved.FrozenA = cfg.LoRADropout, cfg.Method == MethodLoRAFA
			fromAdapter, err := lora.New(saved)
			if err != nil {
				return nil, fmt.Errorf("init_adapter %s: %w", cfg.InitAdapter, err)
			}
			for path := range peft.Set.Adapters {
				peft.Set.Adapters[path] = fromAdapter(peft.Set.Layers[path])
			}
			t.Adapters = peft.Set
			t.initAdapter = src
			params = withOverrides(params, peft.Modules)
		} else if t.Adapters, err = adapter.NewSet(model.LinearLayers(), cfg.LoRATarget, newAdapter, cfg.Seed, BaseWeights(model)); err != nil {
			return nil, err
		}
	}
	train, frozen, err := SplitTrainable(cfg, params.Names(), t.Adapters)
	if err != nil {
		return nil, err
	}
	all := withOverrides(params, nil)
	if t.Adapters != nil {
		all = withOverrides(params, t.Adapters.Params)
	}
	compute := t.computeDType()
	for _, name := range train {
		t.Train[name] = all[name]
	}
	for _, name := range frozen {
		if isNF4(name) {
			t.Frozen[name] = all[name] // codes and scales stay as they are; the graph dequantises them
			continue
		}
		p, err := convert(all[name], compute)
		if err != nil {
			return nil, fmt.Errorf("parameter %q: %w", name, err)
		}
		t.Frozen[name] = p
	}
	if err := t.initReference(); err != nil {
		return nil, err
	}
	rng, err := graph.RNGStateFromSeed(int64(cfg.Seed))
	if err != nil {
		return nil, err
	}
	t.RNG = rng
	for name, p := range t.Train {
		t.M[name] = zerosLike(p)
		if cfg.Optimizer == "adamw" {
			t.V[name] = zerosLike(p)
		}
	}
	return t, nil
}

// sameTargets checks that the layers cfg's lora_targets select (none given: nothing to check) are the layers the
// init adapter set adapts.
func sameTargets(model Model, cfg Config, set *adapter.Set) error {
	if len(cfg.LoRATarget) == 0 {
		return nil
	}
	selected, err := adapter.SelectLayers(model.LinearLayers(), cfg.LoRATarget)
	if err != nil {
		return fmt.Errorf("lora_targets: %w", err)
	}
	var paths []string
	for _, l := range selected {
		paths = append(paths, l.Path)
	}
	if have := set.Paths(); !slices.Equal(paths, have) {
		return fmt.Errorf("lora_targets %v selects %d layers but init_adapter %s adapts %d (%s ... %s): leave lora_targets out, the adapter sets them",
			cfg.LoRATarget, len(paths), cfg.InitAdapter, len(have), have[0], have[len(have)-1])
	}
	return nil
}

// withOverrides returns p with the tensors of over replacing (or adding) those of the same name.
func withOverrides(p, over models.Params) models.Params {
	if len(over) == 0 {
		return p
	}
	out := models.Params{}
	for n, v := range p {
		out[n] = v
	}
	for n, v := range over {
		out[n] = v
	}
	return out
}

func (t *Trainer) computeDType() dtypes.DType {
	if t.Config.ComputeDType == "bfloat16" {
		return dtypes.BFloat16
	}
	return dtypes.Float32
}

// TrainableCount returns the number of trainable scalars.
func (t *Trainer) TrainableCount() int {
	n := 0
	for _, p := range t.Train {
		n += p.Shape().Size()
	}
	return n
}

func zerosLike(p *tensors.Tensor) *tensors.Tensor {
	return tensors.FromShape(shapes.Make(dtypes.Float32, p.Shape().Dimensions...))
}

// convert returns p in dtype (p itself when it already is); float32 to bfloat16 is the only conversion.
func convert(p *tensors.Tensor, dtype dtypes.DType) (*tensors.Tensor, error) {
	if p.DType() == dtype {
		return p, nil
	}
	if p.DType() != dtypes.Float32 || dtype != dtypes.BFloat16 {
		return nil, fmt.Errorf("cannot convert %s to %s", p.DType(), dtype)
	}
	return models.BFloat16Tensor(p)
}

func tokens(b Batch) int {
	if isPairBatch(b) {
		return pairTokens(b)
	}
	t := b["attention_mask"]
	if t == nil {
		t = b["input_ids"]
		if t == nil {
			return 0
		}
		return t.Shape().Size()
	}
	n := 0
	t.MustConstFlatData(func(f any) {
		switch v := f.(type) {
		case []int32:
			for _, x := range v {
				if x != 0 {
					n++
				}
			}
		case []int64:
			for _, x := range v {
				if x != 0 {
					n++
				}
			}
		default:
			n = t.Shape().Size()
		}
	})
	return n
}

// SavedReport returns the saved-activation report of the training step for b's shapes (building the step if
// needed): the forward tensors its backward pass reads (the update and the gradient accumulation keep none).
func (t *Trainer) SavedReport(b Batch) *memory.SavedReport {
	sp, err := t.programFor(b, progFinal, max(1, t.Config.AccumSteps))
	if err != nil {
		return &memory.SavedReport{}
	}
	return sp.saved
}

// StepGraph returns the compiled program that runs an optimizer step's last micro-batch for b's shapes
// (forward, backward, accumulation and update; building it if needed), for instance to count its matmul FLOPs
// with memory.MatmulFLOPs.
func (t *Trainer) StepGraph(b Batch) (*graph.Graph, error) {
	sp, err := t.programFor(b, progFinal, max(1, t.Config.AccumSteps))
	if err != nil {
		return nil, err
	}
	return sp.g, nil
}

// Release frees what the trainer holds on its backend and owns: the tensors its programs produced (after a step:
// the trainable tensors, the optimizer state, the RNG and Mesa states) and its compiled programs. Tensors it
// did not produce (the model's parameters, an initial adapter) are left alone. Call it when the trainer is done
// (after any export) and before another trainer's memory is measured in the same process: the pool counter of
// tools/peakmem counts every buffer alive in the process. The trainer cannot be used afterwards.
func (t *Trainer) Release() {
	for tt := range t.owned {
		tt.FinalizeAll()
	}
	for _, sp := range t.programs {
		sp.g.Finalize()
	}
	if t.evalRunner != nil {
		t.evalRunner.Release()
	}
	t.Train, t.M, t.V, t.owned, t.RNG, t.ok, t.Mesa = nil, nil, nil, nil, nil, nil, nil
	t.programs = nil
}
