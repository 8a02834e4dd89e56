package finetune

import (
	"fmt"
	"os"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/auto"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/quant"
)

// Variant is one combination of the memory-saving options, applied on top of a Config.
type Variant struct {
	Name      string
	ApproxAct bool
	MSNorm    bool
	GradCkpt  bool
	// Mesa lists the activation kinds stored as int8 (quant.Mesa).
	Mesa []string
}

// Apply returns cfg with the variant's options set (and the others cleared).
func (v Variant) Apply(cfg Config) Config {
	cfg.ApproxAct, cfg.MSNorm, cfg.GradCkpt, cfg.Mesa = v.ApproxAct, v.MSNorm, v.GradCkpt, v.Mesa
	return cfg
}

// Variants are the memory-saving variants that PlanMemory compares by default, plain first.
var Variants = []Variant{
	{Name: "plain"},
	{Name: "approx-act", ApproxAct: true},
	{Name: "ms-norm", MSNorm: true},
	{Name: "approx-act+ms-norm", ApproxAct: true, MSNorm: true},
	{Name: "grad-ckpt", GradCkpt: true},
	{Name: "mesa", Mesa: []string{quant.MesaActivation, quant.MesaNorm}},
	{Name: "approx-act+ms-norm+mesa-softmax", ApproxAct: true, MSNorm: true, Mesa: []string{quant.MesaSoftmax}},
}

// VariantByName returns the named variant of Variants.
func VariantByName(name string) (Variant, error) {
	for _, v := range Variants {
		if v.Name == name {
			return v, nil
		}
	}
	names := make([]string, len(Variants))
	for i, v := range Variants {
		names[i] = v.Name
	}
	return Variant{}, fmt.Errorf("unknown variant %q (have %v)", name, names)
}

// Shape is the input shape of a memory plan: the batch size and, for LLaMA, the sequence length (ViT uses the
// model's image size).
type Shape struct {
	Batch int `json:"batch"`
	Seq   int `json:"seq,omitempty"`
}

// MemoryVariant is the memory of one training step in one variant.
type MemoryVariant struct {
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
}

// MemoryReport compares the variants of one training configuration.
type MemoryReport struct {
	Model        string          `json:"model"`
	ModelType    string          `json:"model_type"`
	Method       string          `json:"method"`
	ComputeDType string          `json:"compute_dtype"`
	Attention    string          `json:"attention"`
	Shape        Shape           `json:"shape"`
	Backend      string          `json:"backend"`
	Variants     []MemoryVariant `json:"variants"`
}

// ShapeModel returns the model at dir (a Hugging Face folder: only config.json is read) or, when dir is not a
// folder, the named preset, as "arch:name" or just the name when only one architecture has it (vit: "tiny",
// "vit-b16" with labels classes, 0 for the bare ViTModel; llama: "tiny", "llama-1b", "llama-7b", a causal LM
// when labels is 0), built in cfg's modes without any weights: enough to
// build training graphs, not to run them. It also returns the checkpoint's parameter shapes after folding.
func ShapeModel(dir string, cfg Config, labels int) (Model, map[string][]int, error) {
	kind, err := attention.ParseKind(cfg.Attention)
	if err != nil {
		return nil, nil, err
	}
	var model Model
	if st, statErr := os.Stat(dir); statErr == nil && st.IsDir() {
		mt, err := auto.ModelType(dir)
		if err != nil {
			return nil, nil, err
		}
		switch mt {
		case "vit":
			c, err := vit.LoadConfig(dir)
			if err != nil {
				return nil, nil, err
			}
			model = ViT{Model: &vit.Model{Config: c}}
		case "llama":
			c, err := llama.LoadConfig(dir)
			if err != nil {
				return nil, nil, err
			}
			model = Llama{Model: &llama.Model{Config: c}}
		default:
			return nil, nil, fmt.Errorf("model type %q cannot be trained", mt)
		}
	} else {
		arch, name, qualified := strings.Cut(dir, ":")
		if !qualified {
			arch, name = "", dir
		}
		vc, verr := vit.Preset(name, labels)
		lc, lerr := llama.Preset(name, labels)
		switch {
		case arch == "vit" && verr == nil, arch == "" && verr == nil && lerr != nil:
			model = ViT{Model: &vit.Model{Config: vc}}
		case arch == "llama" && lerr == nil, arch == "" && lerr == nil && verr != nil:
			model = Llama{Model: &llama.Model{Config: lc}}
		case arch == "" && verr == nil && lerr == nil:
			return nil, nil, fmt.Errorf("preset %q exists for vit and llama: write vit:%s or llama:%s", name, name, name)
		case statErr != nil && !os.IsNotExist(statErr):
			return nil, nil, statErr
		default:
			return nil, nil, fmt.Errorf("%s is neither a model folder nor a preset (vit: %s; llama: %s)", dir,
				strings.Join(sortedKeys(vit.Presets), ", "), strings.Join(sortedKeys(llama.Presets), ", "))
		}
	}
	switch m := model.(type) {
	case ViT:
		m.Options = vit.Options{ApproxActivation: cfg.ApproxAct, MSNorm: cfg.MSNorm, GradCheckpoint: cfg.GradCkpt, Attention: kind}
	case Llama:
		m.Options = llama.Options{ApproxActivation: cfg.ApproxAct, MSNorm: cfg.MSNorm, GradCheckpoint: cfg.GradCkpt, Attention: kind}
	}
	if err := applyBlockPlan(model, cfg); err != nil {
		return nil, nil, err
	}
	return model, planShapes(model, cfg), nil
}

// planShapes returns the parameter shapes a plan of cfg builds model's step over: the architecture's, folded
// when cfg.MSNorm (QLoRA's NF4 tensors are PlanStep's to add).
func planShapes(model Model, cfg Config) map[string][]int {
	if cfg.MSNorm {
		return models.FoldedShapes(model.Shapes(), model.Folds())
	}
	return model.Shapes()
}

// MaxPlanSeq is the longest sequence PlanStep plans for: building a step allocates host constants sized by the
// sequence (RoPE tables), so a typo such as --seq 100000000 must stop here rather than exhaust the machine.
const MaxPlanSeq = 1 << 20

// PlanStep builds (without running it) the gradient step of cfg on model, whose parameters have the given
// shapes, for a batch of the given shape, and returns its memory: saved activations read off the graph, the
// step's peak (simulated for the pure-Go backend, compiled-program sizes for XLA), weights, gradients and
// optimizer bytes.
func PlanStep(backend compute.Backend, model Model, paramShapes map[string][]int, cfg Config, in Shape) (MemoryVariant, error) {
	g, outputs, spec, err := planGraph(backend, model, paramShapes, cfg, in)
	if err != nil {
		return MemoryVariant{}, err
	}
	defer g.Finalize()
	return planFigures(g, outputs, spec, model, cfg)
}

// planGraph builds and compiles PlanStep's gradient step (without running it) and returns it with its outputs
// and the parameter shapes it trains and freezes.
func planGraph(backend compute.Backend, model Model, paramShapes map[string][]int, cfg Config, in Shape) (*graph.Graph, []*graph.Node, stepSpec, error) {
	fail := func(err error) (*graph.Graph, []*graph.Node, stepSpec, error) { return nil, nil, stepSpec{}, err }
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	if in.Batch <= 0 {
		return fail(fmt.Errorf("batch size must be positive, got %d", in.Batch))
	}
	if err := checkTrainable(model); err != nil {
		return fail(err)
	}
	compute := dtypes.Float32
	if cfg.ComputeDType == "bfloat16" {
		compute = dtypes.BFloat16
	}
	spec := stepSpec{model: model, compute: compute, batch: map[string]shapes.Shape{},
		frozen: map[string]shapes.Shape{}, train: map[string]shapes.Shape{}}
	switch m := model.(type) {
	case ViT:
		c := m.Config
		spec.batch["pixel_values"] = shapes.Make(dtypes.Float32, in.Batch, c.NumChannels, c.ImageSize, c.ImageSize)
		spec.batch["labels"] = shapes.Make(dtypes.Int32, in.Batch)
	case Llama:
		if in.Seq <= 0 || in.Seq > MaxPlanSeq {
			return fail(fmt.Errorf("a LLaMA step plan needs a sequence length from 1 to %d tokens (got %d)", MaxPlanSeq, in.Seq))
		}
		spec.batch["input_ids"] = shapes.Make(dtypes.Int32, in.Batch, in.Seq)
		spec.batch["attention_mask"] = shapes.Make(dtypes.Int32, in.Batch, in.Seq)
		if m.Config.Architecture == llama.ArchClassification {
			spec.batch["labels"] = shapes.Make(dtypes.Int32, in.Batch)
		} else {
			spec.batch["labels"] = shapes.Make(dtypes.Int32, in.Batch, in.Seq)
		}
	default:
		return fail(fmt.Errorf("memory planning does not know model %T", model))
	}
	var set *adapter.Set
	switch cfg.Method {
	case MethodLoRA, MethodLoRAFA, MethodQLoRA, MethodFull:
	default:
		return fail(fmt.Errorf("memory planning supports methods full, lora, lora-fa and qlora, not %q", cfg.Method))
	}
	if newAdapter, err := newAdapters(cfg); err != nil {
		return fail(err)
	} else if newAdapter != nil {
		if set, err = adapter.NewSet(model.LinearLayers(), cfg.LoRATarget, newAdapter, cfg.Seed, adapter.WeightsOf(nil)); err != nil {
			return fail(err)
		}
		spec.adapters = set
	}
	// The base parameters as the trainer sees them: QLoRA's non-head linear weights as their NF4 tensors.
	base := map[string]shapes.Shape{}
	for name, dims := range paramShapes {
		base[name] = shapes.Make(dtypes.Float32, dims...)
	}
	if cfg.Method == MethodQLoRA {
		nf4Shapes(base, model.LinearLayers(), model.Folds(), cfg.MSNorm)
	}
	train, frozen, err := SplitTrainable(cfg, sortedKeys(base), set)
	if err != nil {
		return fail(err)
	}
	for _, name := range train {
		if s, ok := base[name]; ok {
			spec.train[name] = s
		} else {
			spec.train[name] = shapes.Make(dtypes.Float32, set.Params[name].Shape().Dimensions...)
		}
	}
	for _, name := range frozen {
		switch s, ok := base[name]; {
		case ok && isNF4(name):
			spec.frozen[name] = s
		case ok:
			spec.frozen[name] = shapes.Make(compute, s.Dimensions...)
		default:
			spec.frozen[name] = shapes.Make(compute, set.Params[name].Shape().Dimensions...)
		}
	}
	spec.mesa, _ = quant.ParseMesa(cfg.Mesa)
	spec.blockMesa = usesBlockMesa(model)
	g, outputs, _, err := buildGradStep(backend, spec)
	if err != nil {
		return fail(err)
	}
	return g, outputs, spec, nil
}

// planFigures reads the memory figures of PlanStep off its compiled gradient step.
func planFigures(g *graph.Graph, outputs []*graph.Node, spec stepSpec, model Model, cfg Config) (MemoryVariant, error) {
	backend := g.Backend()
	saved, err := memory.Saved(g, outputs...)
	if err != nil {
		return MemoryVariant{}, err
	}
	var peak memory.Peak
	if backend.Name() == "xla" {
		peak, err = memory.XLAProgramPeak(g)
	} else {
		peak, err = memory.SimulatePeak(g, memory.SimOptions{})
	}
	if err != nil {
		return MemoryVariant{}, err
	}
	v := MemoryVariant{SavedActivationBytes: saved.Total, SavedByKind: map[string]int64{}, SavedMethod: memory.MethodSavedWalk,
		PeakBytes: peak.Bytes, PeakMethod: string(peak.Method)}
	for _, k := range engine.Kinds {
		v.SavedByKind[k.String()] = saved.ByKind[k]
	}
	for name, s := range spec.frozen {
		v.WeightsBytes += int64(s.Memory())
		if isNF4(name) {
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
	for _, s := range spec.train {
		b := int64(s.Memory())
		v.WeightsBytes += b
		v.GradientBytes += b
		v.OptimizerBytes += moments * b
		v.TrainableParams += int64(s.Size())
	}
	v.TotalBytes = v.PeakBytes + v.OptimizerBytes
	return v, nil
}

// PlanMemory plans cfg's training step on the model at dir (a folder or a preset name, see ShapeModel) in every
// variant (Variants when nil) and returns them side by side, with ratios to the first.
func PlanMemory(backend compute.Backend, dir string, cfg Config, labels int, in Shape, variants []Variant) (*MemoryReport, error) {
	if len(variants) == 0 {
		variants = Variants
	}
	rep := &MemoryReport{Model: dir, Method: cfg.Method, ComputeDType: cfg.ComputeDType, Attention: cfg.Attention,
		Shape: in, Backend: backend.Name()}
	for _, v := range variants {
		vc := v.Apply(cfg)
		model, shp, err := ShapeModel(dir, vc, labels)
		if err != nil {
			return nil, err
		}
		rep.ModelType = map[bool]string{true: "vit", false: "llama"}[isViT(model)]
		if rep.ModelType == "vit" {
			rep.Shape.Seq = 0
		}
		mv, err := PlanStep(backend, model, shp, vc, in)
		if err != nil {
			return nil, fmt.Errorf("variant %s: %w", v.Name, err)
		}
		mv.Name = v.Name
		rep.Variants = append(rep.Variants, mv)
	}
	base := rep.Variants[0]
	for i := range rep.Variants {
		v := &rep.Variants[i]
		v.SavedRatio = ratio(v.SavedActivationBytes, base.SavedActivationBytes)
		v.PeakRatio = ratio(v.PeakBytes, base.PeakBytes)
		v.TotalRatio = ratio(v.TotalBytes, base.TotalBytes)
	}
	return rep, nil
}

func isViT(m Model) bool { _, ok := m.(ViT); return ok }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Fit is the largest batch size or sequence length whose training step fits a memory budget.
type Fit struct {
	Variant string `json:"variant"`
	// Max is the largest value that fits (0: not even 1 fits); Bytes is TotalBytes at Max.
	Max   int   `json:"max"`
	Bytes int64 `json:"total_bytes"`
}

// MaxFit finds, for each variant, the largest batch size (axis "batch") or sequence length (axis "seq", LLaMA
// only) up to limit whose step's TotalBytes (peak + optimizer state) is at most budget, with the other
// dimension as in.
func MaxFit(backend compute.Backend, dir string, cfg Config, labels int, in Shape, axis string, budget int64, limit int, variants []Variant) ([]Fit, error) {
	if axis != "batch" && axis != "seq" {
		return nil, fmt.Errorf("axis must be batch or seq, got %q", axis)
	}
	if budget <= 0 || limit <= 0 {
		return nil, fmt.Errorf("budget and limit must be positive")
	}
	if axis == "seq" && limit > MaxPlanSeq {
		return nil, fmt.Errorf("--max-seq %d: memfit plans sequences up to %d tokens", limit, MaxPlanSeq)
	}
	if len(variants) == 0 {
		variants = Variants
	}
	var out []Fit
	for _, v := range variants {
		vc := v.Apply(cfg)
		model, shp, err := ShapeModel(dir, vc, labels)
		if err != nil {
			return nil, err
		}
		if axis == "seq" && isViT(model) {
			return nil, fmt.Errorf("--max-seq applies to LLaMA models; a ViT's sequence is fixed by its image size")
		}
		cache := map[int]int64{}
		bytesAt := func(n int) (int64, error) {
			if b, ok := cache[n]; ok {
				return b, nil
			}
			s := in
			if axis == "batch" {
				s.Batch = n
			} else {
				s.Seq = n
			}
			mv, err := PlanStep(backend, model, shp, vc, s)
			if err != nil {
				return 0, err
			}
			cache[n] = mv.TotalBytes
			return mv.TotalBytes, nil
		}
		fit := Fit{Variant: v.Name}
		// Double until the budget is exceeded (or the limit reached), then bisect.
		// A causal LM needs two tokens at least (one prediction); batches start at one example.
		start := 1
		if axis == "seq" {
			start = 2
		}
		lo, hi := 0, min(start, limit)
		for {
			b, err := bytesAt(hi)
			if err != nil {
				return nil, err
			}
			if b > budget {
				break
			}
			lo, fit.Bytes = hi, b
			if hi == limit {
				break
			}
			hi = min(2*hi, limit)
		}
		if lo > 0 && lo < hi && lo != limit {
			for hi-lo > 1 {
				mid := (lo + hi) / 2
				b, err := bytesAt(mid)
				if err != nil {
					return nil, err
				}
				if b <= budget {
					lo, fit.Bytes = mid, b
				} else {
					hi = mid
				}
			}
		}
		fit.Max = lo
		out = append(out, fit)
	}
	return out, nil
}
