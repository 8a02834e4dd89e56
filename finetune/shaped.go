package finetune

import (
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
)

// StepShapes is a training step described by shapes alone, without any weights: the model, the shapes of its
// checkpoint's parameters, the training config and the batch's tensor shapes. The memory planner (package plan)
// builds steps from them to read their memory without running them.
type StepShapes struct {
	// Model is the model in the config's modes; its weights are not read (a model made from config.json alone
	// will do).
	Model Model
	// Params are the checkpoint's parameter shapes by name as a step of Config holds them before quantisation:
	// folded with MS-norm (ParamShapes).
	Params map[string][]int
	// Config is the training config.
	Config Config
	// Batch are the batch's tensor shapes by input name.
	Batch map[string]shapes.Shape
}

// ShapedStep is the gradient step of StepShapes, built and compiled but never run.
type ShapedStep struct {
	// Graph is the compiled gradient step (the caller finalizes it).
	Graph *graph.Graph
	// Outputs are its results: the loss, the gradient of every trainable tensor (float32, sorted by name), the
	// next RNG state and the Mesa states; what memory.Saved walks back from.
	Outputs []*graph.Node
	// Train and Frozen are the trainable and frozen tensors' shapes as the trainer holds them: trainable ones in
	// float32, frozen ones in the compute dtype, NF4 tensors as they are stored.
	Train, Frozen map[string]shapes.Shape
}

// ParamShapes returns the parameter shapes a step of cfg builds model's step over: the architecture's, folded
// when cfg.MSNorm (QLoRA's NF4 tensors are added by the step itself).
func ParamShapes(model Model, cfg Config) map[string][]int {
	if cfg.MSNorm {
		return models.FoldedShapes(model.Shapes(), model.Folds())
	}
	return model.Shapes()
}

// spec returns the step spec of s: the trainable and frozen tensors as the trainer would split and convert them,
// the adapters the config creates, the Mesa kinds.
func (s StepShapes) spec() (stepSpec, error) {
	cfg, model := s.Config, s.Model
	if err := cfg.Validate(); err != nil {
		return stepSpec{}, err
	}
	if err := CheckTrainable(model); err != nil {
		return stepSpec{}, err
	}
	compute := dtypes.Float32
	if cfg.ComputeDType == "bfloat16" {
		compute = dtypes.BFloat16
	}
	spec := stepSpec{model: model, compute: compute, batch: s.Batch,
		frozen: map[string]shapes.Shape{}, train: map[string]shapes.Shape{}}
	var set *adapter.Set
	switch cfg.Method {
	case MethodLoRA, MethodLoRAFA, MethodQLoRA, MethodFull:
	default:
		return stepSpec{}, fmt.Errorf("memory planning supports methods full, lora, lora-fa and qlora, not %q", cfg.Method)
	}
	if newAdapter, err := newAdapters(cfg); err != nil {
		return stepSpec{}, err
	} else if newAdapter != nil {
		if set, err = adapter.NewSet(model.LinearLayers(), cfg.LoRATarget, newAdapter, cfg.Seed, adapter.WeightsOf(nil)); err != nil {
			return stepSpec{}, err
		}
		spec.adapters = set
	}
	// The base parameters as the trainer sees them: QLoRA's non-head linear weights as their NF4 tensors.
	base := map[string]shapes.Shape{}
	for name, dims := range s.Params {
		base[name] = shapes.Make(dtypes.Float32, dims...)
	}
	if cfg.Method == MethodQLoRA {
		nf4Shapes(base, model.LinearLayers(), model.Folds(), cfg.MSNorm)
	}
	train, frozen, err := SplitTrainable(cfg, sortedKeys(base), set)
	if err != nil {
		return stepSpec{}, err
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
	spec.config = cfg
	referenceShapes(&spec) // a DPO step's frozen copies of the reference
	return spec, nil
}

// GradientStep builds and compiles, without running it, the gradient computation of s: the forward pass, the
// loss and the backward pass, the part of the trainer's step that holds the activations (the trainer's
// programs contain this very graph).
func (s StepShapes) GradientStep(backend compute.Backend) (*ShapedStep, error) {
	spec, err := s.spec()
	if err != nil {
		return nil, err
	}
	g, outputs, _, err := buildGradStep(backend, spec)
	if err != nil {
		return nil, err
	}
	return &ShapedStep{Graph: g, Outputs: outputs, Train: spec.train, Frozen: spec.frozen}, nil
}

// CompileDeviceStep builds and compiles, without running it, the device-resident step's program of s for one
// micro-batch (forward, backward and the optimizer update) and returns the seconds that took.
func (s StepShapes) CompileDeviceStep(backend compute.Backend) (float64, error) {
	spec, err := s.spec()
	if err != nil {
		return 0, err
	}
	sp, _, err := buildStepProgram(backend, s.Config, spec, progFinal, 1)
	if err != nil {
		return 0, err
	}
	sp.g.Finalize()
	return sp.compileSeconds, nil
}
