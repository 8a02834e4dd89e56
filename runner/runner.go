// Package runner runs a model's forward pass with fixed parameters and adapters, for evaluation and inference:
// logits (or any output built from the bound model) of a batch, compiling one graph per batch signature. The
// trainer (finetune) and the evaluations (evals) both use it, so evals need not import the trainer.
package runner

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
)

// Batch is one batch of model inputs by name ("pixel_values", "input_ids", "attention_mask", "labels", ...).
type Batch map[string]*tensors.Tensor

// Size returns the batch size (the first dimension of its tensors), or 0 for an empty batch.
func (b Batch) Size() int {
	for _, t := range b {
		if t.Rank() > 0 {
			return t.Shape().Dim(0)
		}
	}
	return 0
}

// Names returns the batch's tensor names, sorted (the order a compiled graph takes them in).
func (b Batch) Names() []string {
	out := make([]string, 0, len(b))
	for n := range b {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Signature names the batch's tensors and shapes: batches with the same signature share a compiled graph.
func (b Batch) Signature() string {
	var sb strings.Builder
	for _, n := range b.Names() {
		fmt.Fprintf(&sb, "%s%s;", n, b[n].Shape())
	}
	return sb.String()
}

// Model is what running a model needs: its parameters, its linear layers (for adapters and NF4 weights) and
// its logits of a batch.
type Model interface {
	// Params returns the graph parameters by Hugging Face name (folded when MS-norm is on).
	Params() models.Params
	// LinearLayers lists the layers adapters can wrap.
	LinearLayers() []models.LinearLayer
	// Logits builds the model's logits for a batch (labels are not needed).
	Logits(b models.Bound, batch map[string]*graph.Node) *graph.Node
}

// BatchChecker is implemented by models that can check a batch against themselves (token ids within the
// vocabulary, labels within the classes, ...); Output and LogitsRunner.Logits call it before computing.
type BatchChecker interface {
	CheckBatch(b Batch) error
}

func check(model Model, b Batch) error {
	if c, ok := model.(BatchChecker); ok {
		return c.CheckBatch(b)
	}
	return nil
}

// NF4Weights returns the Bound.Weights hook that dequantises the layers' NF4 weights (QLoRA's frozen base) in
// dtype; a layer without NF4 tensors keeps its float weight.
func NF4Weights(layers []models.LinearLayer, dtype dtypes.DType) models.WeightHook {
	dims := map[string][2]int{}
	for _, l := range layers {
		dims[l.Path] = [2]int{l.Out, l.In}
	}
	return func(b models.Bound, path string) *graph.Node {
		p, ok := quant.BoundNodes(b.Nodes, path+".weight")
		d, known := dims[path]
		if !ok || !known {
			return nil
		}
		return quant.Weight(p, d[0], d[1], dtype)
	}
}

// Output builds fn (logits, loss, ...) of model bound to params (model.Params() when nil) and the adapters of
// set (none when nil), compiles it and runs it on batch, once.
func Output(backend compute.Backend, model Model, params models.Params, set *adapter.Set, batch Batch,
	fn func(b models.Bound, nodes map[string]*graph.Node) *graph.Node) (*tensors.Tensor, error) {
	if err := check(model, batch); err != nil {
		return nil, err
	}
	if params == nil {
		params = model.Params()
	}
	var out *tensors.Tensor
	err := engine.Try(func() {
		g := graph.NewGraph(backend, "eval")
		defer g.Finalize()
		nodes := map[string]*graph.Node{}
		args := []any{}
		for _, n := range batch.Names() {
			nodes[n] = graph.Parameter(g, "batch."+n, batch[n].Shape())
			args = append(args, batch[n])
		}
		b := bind(g, model, params, set)
		args = append(args, paramArgs(params, set)...)
		if err := g.Compile(fn(b, nodes)); err != nil {
			panic(err) // engine.Try returns it: the backend's cause, not a later "not compiled"
		}
		out = g.Run(args...)[0]
	})
	return out, err
}

// Logits computes model's logits on batch with params (model.Params() when nil) and the adapters of set (none
// when nil), compiling a graph for this one call; LogitsRunner reuses its graphs.
func Logits(backend compute.Backend, model Model, params models.Params, set *adapter.Set, batch Batch) (*tensors.Tensor, error) {
	return Output(backend, model, params, set, batch, model.Logits)
}

// LogitsRunner computes a model's logits with fixed parameters and adapters, compiling one graph per batch
// signature (names and shapes) and reusing it, for evaluation loops: an OutputsRunner of the model's logits.
type LogitsRunner struct {
	Backend compute.Backend
	Model   Model
	Params  models.Params
	Set     *adapter.Set
	outputs *OutputsRunner
}

// NewLogitsRunner returns a runner over model with params (model.Params() when nil) and adapters (none when set
// is nil).
func NewLogitsRunner(backend compute.Backend, model Model, params models.Params, set *adapter.Set) *LogitsRunner {
	if params == nil {
		params = model.Params()
	}
	logits := func(b models.Bound, batch map[string]*graph.Node) []*graph.Node {
		return []*graph.Node{model.Logits(b, batch)}
	}
	return &LogitsRunner{Backend: backend, Model: model, Params: params, Set: set, outputs: NewOutputsRunner(backend, model, logits)}
}

// Logits returns the logits of batch.
func (r *LogitsRunner) Logits(batch Batch) (*tensors.Tensor, error) {
	out, err := r.outputs.Run(r.Params, r.Set, batch)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// bind binds params (the model's) and the adapters of set (nil: none) into g: the parameters in params.Names()
// order, then the adapters' in theirs; NF4 weights dequantised in float32, the adapters applied through the
// set's hook.
func bind(g *graph.Graph, model Model, params models.Params, set *adapter.Set) models.Bound {
	b := models.Bind(g, params)
	b.Weights = NF4Weights(model.LinearLayers(), dtypes.Float32)
	if set != nil {
		b = b.Merge(models.Bind(g, set.Params))
		b.Linear = set.Hook()
	}
	return b
}

// paramArgs returns the tensors of params and set in the order bind's graph parameters take them.
func paramArgs(params models.Params, set *adapter.Set) []any {
	var args []any
	for _, t := range (models.Bound{Names: params.Names()}).Inputs(params) {
		args = append(args, t)
	}
	if set != nil {
		for _, t := range (models.Bound{Names: set.Params.Names()}).Inputs(set.Params) {
			args = append(args, t)
		}
	}
	return args
}
