package runner

import (
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
)

// OutputsRunner computes outputs built from a model (a loss and predictions, say) with parameters given at each
// call, compiling one graph per batch signature and reusing it: the parameters are graph inputs, so a trainer
// can evaluate its current weights after every few steps without compiling again.
type OutputsRunner struct {
	Backend compute.Backend
	Model   Model
	// Fn builds the outputs from the bound model and the batch's nodes.
	Fn     func(b models.Bound, batch map[string]*graph.Node) []*graph.Node
	graphs map[string]*graph.Graph
}

// NewOutputsRunner returns a runner of fn over model on backend.
func NewOutputsRunner(backend compute.Backend, model Model, fn func(b models.Bound, batch map[string]*graph.Node) []*graph.Node) *OutputsRunner {
	return &OutputsRunner{Backend: backend, Model: model, Fn: fn, graphs: map[string]*graph.Graph{}}
}

// Run returns the outputs on batch with params (every parameter of the model) and the adapters of set (nil:
// none); params and set must have the same names and shapes at every call.
func (r *OutputsRunner) Run(params models.Params, set *adapter.Set, batch Batch) ([]*tensors.Tensor, error) {
	if err := check(r.Model, batch); err != nil {
		return nil, err
	}
	sig := fmt.Sprintf("%s|adapters:%v", batch.Signature(), set != nil)
	names := batch.Names()
	var out []*tensors.Tensor
	err := engine.Try(func() {
		g, ok := r.graphs[sig]
		if !ok {
			g = graph.NewGraph(r.Backend, "outputs")
			nodes := map[string]*graph.Node{}
			for _, n := range names {
				nodes[n] = graph.Parameter(g, "batch."+n, batch[n].Shape())
			}
			if err := g.Compile(r.Fn(bind(g, r.Model, params, set), nodes)...); err != nil {
				panic(err) // engine.Try returns it; the graph is not kept
			}
			r.graphs[sig] = g
		}
		args := []any{}
		for _, n := range names {
			args = append(args, batch[n])
		}
		out = g.Run(append(args, paramArgs(params, set)...)...)
	})
	return out, err
}

// Release frees the compiled graphs; the runner compiles again when run after it.
func (r *OutputsRunner) Release() {
	for _, g := range r.graphs {
		g.Finalize()
	}
	r.graphs = map[string]*graph.Graph{}
}
