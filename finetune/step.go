package finetune

import (
	"fmt"
	"sort"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
)

// stepSpec is what the gradient step's graph depends on: the model, its adapters, the compute dtype and the
// shapes of the batch, frozen and trainable tensors (values are not needed to build it).
type stepSpec struct {
	model    Model
	adapters *lora.Set
	compute  dtypes.DType
	batch    map[string]shapes.Shape
	frozen   map[string]shapes.Shape
	train    map[string]shapes.Shape
	// mesa lists the int8-stored kinds (quant.Mesa); their running-range states become extra parameters after
	// the trainable ones and extra outputs after the RNG state.
	mesa []string
}

// buildGradStep builds and compiles the gradient step: its parameters are the batch tensors ("batch.<name>",
// sorted by name), the RNG state, the frozen tensors and the trainable tensors (each sorted by name), in that
// order, then the Mesa range states in creation order; its outputs are the loss, the gradient of every trainable
// tensor (float32, sorted by name), the next RNG state and the updated Mesa states. The Mesa states' shapes are
// returned too.
func buildGradStep(backend compute.Backend, spec stepSpec) (*graph.Graph, []*graph.Node, []shapes.Shape, error) {
	for _, name := range spec.model.BatchInputs() {
		if _, ok := spec.batch[name]; !ok {
			return nil, nil, nil, fmt.Errorf("batch has no %q (the model needs %v)", name, spec.model.BatchInputs())
		}
	}
	var g *graph.Graph
	var outputs []*graph.Node
	var mesaShapes []shapes.Shape
	err := engine.Try(func() {
		g = graph.NewGraph(backend, "train-step")
		batch := map[string]*graph.Node{}
		for _, n := range sortedKeys(spec.batch) {
			batch[n] = graph.Parameter(g, "batch."+n, spec.batch[n])
		}
		rng := engine.NewRNG(graph.Parameter(g, "rng", graph.RNGStateShape))
		bound := models.Bound{Nodes: map[string]*graph.Node{}, Training: true, RNG: rng}
		for _, n := range sortedKeys(spec.frozen) {
			bound.Nodes[n] = graph.Parameter(g, n, spec.frozen[n])
			bound.Names = append(bound.Names, n)
		}
		trainNames := sortedKeys(spec.train)
		trainNodes := make([]*graph.Node, len(trainNames))
		for i, n := range trainNames {
			trainNodes[i] = graph.Parameter(g, n, spec.train[n])
			node := trainNodes[i]
			if spec.compute != dtypes.Float32 {
				node = graph.ConvertDType(node, spec.compute)
			}
			bound.Nodes[n] = node
			bound.Names = append(bound.Names, n)
		}
		sort.Strings(bound.Names)
		if spec.adapters != nil {
			bound.Linear = spec.adapters.Hook()
		}
		bound.Weights = nf4Hook(spec.model.LinearLayers(), spec.compute)
		var mesa *quant.Mesa
		if len(spec.mesa) > 0 {
			mesa = quant.NewMesa(spec.mesa, rng)
			bound.Mesa = mesa
		}
		if spec.compute != dtypes.Float32 {
			for n, node := range batch {
				if node.DType() == dtypes.Float32 {
					batch[n] = graph.ConvertDType(node, spec.compute)
				}
			}
		}
		loss := spec.model.Loss(bound, batch)
		grads := engine.Gradient(loss, trainNodes...)
		outputs = append(append([]*graph.Node{loss}, grads...), rng.State())
		if mesa != nil {
			outputs = append(outputs, mesa.Out...)
			for _, in := range mesa.In {
				mesaShapes = append(mesaShapes, in.Shape())
			}
		}
		g.Compile(outputs...)
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("building the training step: %w", err)
	}
	return g, outputs, mesaShapes, nil
}
