package finetune

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
)

// Trainer trains a model: it owns the trainable parameters (float32 master copies), the frozen ones, the
// optimizer state and the step count.
type Trainer struct {
	Config  Config
	Model   Model
	Backend compute.Backend
	// Adapters are the LoRA adapters (nil for full fine-tuning).
	Adapters *lora.Set

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

	gradSteps map[string]*gradStep
	update    *updateStep
}

// StepStats describes one optimizer step.
type StepStats struct {
	Step     int     `json:"step"`
	Loss     float64 `json:"loss"`
	LR       float64 `json:"lr"`
	GradNorm float64 `json:"grad_norm"`
	// Examples and Tokens processed (tokens: real tokens of text batches, from attention_mask or input_ids).
	Examples int `json:"examples"`
	Tokens   int `json:"tokens,omitempty"`
	// Seconds is the wall time of the step (gradient computations and the update).
	Seconds float64 `json:"seconds"`
	// ExamplesPerSecond and TokensPerSecond are the step's throughput (tokens for text batches only).
	ExamplesPerSecond float64 `json:"examples_per_second"`
	TokensPerSecond   float64 `json:"tokens_per_second,omitempty"`
	// SavedActivationBytes is the exact saved-activation size of the gradient step (training-graph walk).
	SavedActivationBytes int64 `json:"saved_activation_bytes"`
	// PeakBytes is the peak memory of the gradient step and PeakMethod how it was obtained.
	PeakBytes  int64  `json:"peak_bytes"`
	PeakMethod string `json:"peak_method"`
}

// ErrNonFinite is returned when a loss or gradient norm is NaN or infinite; the parameters are left as they
// were before the step.
var ErrNonFinite = errors.New("non-finite loss")

// Option changes how New sets a trainer up.
type Option func(*options)

type options struct{ adapters *lora.Set }

// WithAdapters trains the given adapters (any lora.Adapter implementations, e.g. a custom one) instead of
// creating LoRA adapters; use it with Config.Method "custom".
func WithAdapters(set *lora.Set) Option { return func(o *options) { o.adapters = set } }

// New prepares training of model with cfg on backend: adapters are created and initialised from cfg.Seed
// (lora, lora-fa) or taken from WithAdapters (custom), trainable tensors are chosen, the frozen ones converted
// to the compute dtype, and the optimizer state zeroed.
func New(model Model, cfg Config, backend compute.Backend, opts ...Option) (*Trainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if (cfg.Method == MethodCustom) != (o.adapters != nil) {
		return nil, fmt.Errorf("method custom and WithAdapters go together (method %q)", cfg.Method)
	}
	t := &Trainer{Config: cfg, Model: model, Backend: backend, Train: models.Params{}, Frozen: models.Params{},
		M: models.Params{}, V: models.Params{}, gradSteps: map[string]*gradStep{}}
	params := model.Params()
	trainBase := func(name string) bool {
		if cfg.Method == MethodFull {
			return true
		}
		for _, prefix := range cfg.TrainModules {
			if name == prefix || strings.HasPrefix(name, prefix+".") {
				return true
			}
		}
		return false
	}
	for _, prefix := range cfg.TrainModules {
		found := false
		for name := range params {
			found = found || name == prefix || strings.HasPrefix(name, prefix+".")
		}
		if !found {
			return nil, fmt.Errorf("train_modules: no parameter of the model starts with %q", prefix)
		}
	}
	if cfg.Method == MethodCustom {
		t.Adapters = o.adapters
	} else if cfg.Method != MethodFull {
		lc := lora.Config{Rank: cfg.LoRARank, Alpha: cfg.LoRAAlpha, RSLoRA: cfg.RSLoRA,
			FrozenA: cfg.Method == MethodLoRAFA, Dropout: cfg.LoRADropout}
		newAdapter, err := lora.New(lc)
		if err != nil {
			return nil, err
		}
		if cfg.InitAdapter != "" {
			set, saved, err := ImportAdapter(cfg.InitAdapter, model)
			if err != nil {
				return nil, err
			}
			if saved.Rank != lc.Rank || saved.Alpha != lc.Alpha || saved.RSLoRA != lc.RSLoRA {
				return nil, fmt.Errorf("init_adapter %s has r=%d, alpha=%g, rslora=%v but the config says %d, %g, %v",
					cfg.InitAdapter, saved.Rank, saved.Alpha, saved.RSLoRA, lc.Rank, lc.Alpha, lc.RSLoRA)
			}
			for path := range set.Adapters {
				set.Adapters[path] = newAdapter(set.Layers[path])
			}
			t.Adapters = set
			modules, err := ImportModules(cfg.InitAdapter)
			if err != nil {
				return nil, err
			}
			params = withOverrides(params, modules)
		} else if t.Adapters, err = lora.NewSet(model.LinearLayers(), cfg.LoRATarget, newAdapter, cfg.Seed); err != nil {
			return nil, err
		}
	}
	compute := t.computeDType()
	for name, p := range params {
		if isNF4(name) {
			if trainBase(name) {
				return nil, fmt.Errorf("parameter %q is NF4-quantised and cannot train (train_modules must name float modules)", name)
			}
			t.Frozen[name] = p // codes and scales stay as they are; the graph dequantises them
			continue
		}
		if trainBase(name) {
			t.Train[name] = p
		} else {
			frozen, err := convert(p, compute)
			if err != nil {
				return nil, fmt.Errorf("parameter %q: %w", name, err)
			}
			t.Frozen[name] = frozen
		}
	}
	if t.Adapters != nil {
		trainable := t.Adapters.Trainable()
		for name, p := range t.Adapters.Params {
			if slices.Contains(trainable, name) {
				t.Train[name] = p
			} else {
				frozen, err := convert(p, compute)
				if err != nil {
					return nil, err
				}
				t.Frozen[name] = frozen
			}
		}
	}
	if len(t.Train) == 0 {
		return nil, fmt.Errorf("nothing to train: no trainable parameter")
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

// gradStep is a compiled gradient computation for one batch signature.
type gradStep struct {
	g           *graph.Graph
	outputs     []*graph.Node
	batchNames  []string
	frozenNames []string
	trainNames  []string
	saved       *memory.SavedReport
	peak        *memory.Peak
	mesa        int // Mesa states among the parameters and outputs
}

func batchSignature(b Batch) string {
	names := make([]string, 0, len(b))
	for n := range b {
		names = append(names, n)
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, n := range names {
		fmt.Fprintf(&sb, "%s%s;", n, b[n].Shape())
	}
	return sb.String()
}

// gradFor returns the compiled gradient step for the batch's shapes, building it on first use.
func (t *Trainer) gradFor(b Batch) (*gradStep, error) {
	sig := batchSignature(b)
	if gs, ok := t.gradSteps[sig]; ok {
		return gs, nil
	}
	for _, name := range t.Model.BatchInputs() {
		if _, ok := b[name]; !ok {
			return nil, fmt.Errorf("batch has no %q (the model needs %v)", name, t.Model.BatchInputs())
		}
	}
	gs := &gradStep{batchNames: sortedKeys(b), frozenNames: t.Frozen.Names(), trainNames: t.Train.Names()}
	spec := stepSpec{model: t.Model, adapters: t.Adapters, compute: t.computeDType(),
		batch: map[string]shapes.Shape{}, frozen: map[string]shapes.Shape{}, train: map[string]shapes.Shape{}}
	for n, v := range b {
		spec.batch[n] = v.Shape()
	}
	for n, v := range t.Frozen {
		spec.frozen[n] = v.Shape()
	}
	for n, v := range t.Train {
		spec.train[n] = v.Shape()
	}
	spec.mesa, _ = quant.ParseMesa(t.Config.Mesa)
	var err error
	var mesaShapes []shapes.Shape
	if gs.g, gs.outputs, mesaShapes, err = buildGradStep(t.Backend, spec); err != nil {
		return nil, err
	}
	if t.Mesa == nil && len(mesaShapes) > 0 {
		for _, s := range mesaShapes { // zero: not initialised (the first batch sets the ranges)
			t.Mesa = append(t.Mesa, tensors.FromShape(s))
		}
	}
	if len(mesaShapes) != len(t.Mesa) {
		return nil, fmt.Errorf("the step has %d Mesa states, the trainer %d", len(mesaShapes), len(t.Mesa))
	}
	gs.mesa = len(mesaShapes)
	saved, err := memory.Saved(gs.g, gs.outputs...)
	if err != nil {
		return nil, err
	}
	gs.saved = saved
	t.gradSteps[sig] = gs
	return gs, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// runGrad runs the gradient step on b and returns the loss and the gradients by trainable name.
func (t *Trainer) runGrad(gs *gradStep, b Batch) (float64, map[string]*tensors.Tensor, error) {
	args := make([]any, 0, len(gs.batchNames)+len(gs.frozenNames)+len(gs.trainNames)+1)
	for _, n := range gs.batchNames {
		args = append(args, b[n])
	}
	args = append(args, t.RNG)
	for _, n := range gs.frozenNames {
		args = append(args, t.Frozen[n])
	}
	for _, n := range gs.trainNames {
		args = append(args, t.Train[n])
	}
	for _, m := range t.Mesa {
		args = append(args, m)
	}
	var outs []*tensors.Tensor
	run := func() error {
		return engine.Try(func() { outs = gs.g.Run(args...) })
	}
	var err error
	if gs.peak == nil {
		var p memory.Peak
		p, err = memory.MeasurePeak(gs.g, run)
		if err == nil {
			gs.peak = &p
		}
	} else {
		err = run()
	}
	if err != nil {
		return 0, nil, err
	}
	lossT := outs[0]
	var loss float64
	lossT.MustConstFlatData(func(f any) { loss = float64(f.([]float32)[0]) })
	lossT.MustFinalizeAll()
	grads := map[string]*tensors.Tensor{}
	for i, n := range gs.trainNames {
		grads[n] = outs[1+i]
	}
	t.RNG = outs[len(outs)-1-gs.mesa]
	if gs.mesa > 0 {
		t.Mesa = outs[len(outs)-gs.mesa:]
	}
	return loss, grads, nil
}

// TrainStep runs one optimizer step over the micro-batches (gradient accumulation: the gradients are averaged
// over them; pass Config.AccumSteps batches). On a non-finite loss it returns an error wrapping ErrNonFinite and
// changes nothing.
func (t *Trainer) TrainStep(batches []Batch) (StepStats, error) {
	if len(batches) == 0 {
		return StepStats{}, fmt.Errorf("no batches for the step")
	}
	start := time.Now()
	stats := StepStats{Step: t.Step + 1, LR: t.Config.LearningRate(t.Step)}
	var acc map[string][]float32
	for _, b := range batches {
		gs, err := t.gradFor(b)
		if err != nil {
			return stats, err
		}
		loss, grads, err := t.runGrad(gs, b)
		if err != nil {
			return stats, err
		}
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			freeAll(grads)
			return stats, fmt.Errorf("%w at step %d (loss %v, lr %g): lower the learning rate or check the data", ErrNonFinite, stats.Step, loss, stats.LR)
		}
		stats.Loss += loss / float64(len(batches))
		stats.Examples += b.Size()
		stats.Tokens += tokens(b)
		stats.SavedActivationBytes = max(stats.SavedActivationBytes, gs.saved.Total)
		if gs.peak != nil && gs.peak.Bytes > stats.PeakBytes {
			stats.PeakBytes, stats.PeakMethod = gs.peak.Bytes, string(gs.peak.Method)
		}
		if acc == nil {
			acc = map[string][]float32{}
		}
		for n, g := range grads {
			tensors.MustConstFlatData[float32](g, func(f []float32) {
				if acc[n] == nil {
					acc[n] = make([]float32, len(f))
				}
				for i, v := range f {
					acc[n][i] += v / float32(len(batches))
				}
			})
			g.MustFinalizeAll()
		}
	}
	norm, err := t.applyUpdate(acc, stats.LR)
	if err != nil {
		return stats, err
	}
	stats.GradNorm = norm
	stats.Seconds = time.Since(start).Seconds()
	stats.ExamplesPerSecond = float64(stats.Examples) / stats.Seconds
	stats.TokensPerSecond = float64(stats.Tokens) / stats.Seconds
	return stats, nil
}

func tokens(b Batch) int {
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

func freeAll(ts map[string]*tensors.Tensor) {
	for _, t := range ts {
		t.MustFinalizeAll()
	}
}

// SavedReport returns the saved-activation report of the gradient step for b's shapes (building the step if
// needed).
func (t *Trainer) SavedReport(b Batch) *memory.SavedReport {
	gs, err := t.gradFor(b)
	if err != nil {
		return &memory.SavedReport{}
	}
	return gs.saved
}

// StepGraph returns the compiled gradient step for b's shapes (building it if needed), for instance to count its
// matmul FLOPs with memory.MatmulFLOPs.
func (t *Trainer) StepGraph(b Batch) (*graph.Graph, error) {
	gs, err := t.gradFor(b)
	if err != nil {
		return nil, err
	}
	return gs.g, nil
}
