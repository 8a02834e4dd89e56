package finetune

import (
	"fmt"
	"sort"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
)

// stepSpec is what the gradient step's graph depends on: the model, its adapters, the compute dtype and the
// shapes of the batch, frozen and trainable tensors (values are not needed to build it).
type stepSpec struct {
	model    Model
	adapters *adapter.Set
	compute  dtypes.DType
	batch    map[string]shapes.Shape
	frozen   map[string]shapes.Shape
	train    map[string]shapes.Shape
	// mesa lists the int8-stored kinds (quant.Mesa); their running-range states become extra parameters after
	// the trainable ones and extra outputs after the RNG state.
	mesa []string
	// blockMesa is set when a per-block plan stores some block's activations with Mesa (its own kinds, on a view
	// of the step's Mesa), so the step has a Mesa even when mesa is empty.
	blockMesa bool
	// config is the training config: its objective (objective.go) picks the loss.
	config Config
	// reference is how a DPO step computes its reference model (its frozen copies are among frozen).
	reference reference
}

// gradParts is the gradient computation of a stepSpec built into a graph.
type gradParts struct {
	loss       *graph.Node
	train      []*graph.Node // the trainable tensors' parameters, sorted by name
	grads      []*graph.Node // their gradients (float32), in the same order
	rng        *graph.Node   // the next RNG state
	mesaOut    []*graph.Node // the updated Mesa states
	mesaShapes []shapes.Shape
	// metrics are the objective's metrics (metricsOf), stacked [M] float32; nil for none.
	metrics *graph.Node
}

// buildGrad builds the forward pass, loss and gradients of spec into g (inside engine.Try: it panics on
// errors). It creates g's parameters: the batch tensors ("batch.<name>", sorted by name), the RNG state, the
// frozen tensors and the trainable tensors (each sorted by name), in that order, then the Mesa range states in
// creation order. A caller may add parameters after these.
func buildGrad(g *graph.Graph, spec stepSpec) gradParts {
	var p gradParts
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
	p.train = make([]*graph.Node, len(trainNames))
	for i, n := range trainNames {
		p.train[i] = graph.Parameter(g, n, spec.train[n])
		node := p.train[i]
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
	if len(spec.mesa) > 0 || spec.blockMesa {
		mesa = quant.NewMesa(spec.mesa, rng)
		bound.Mesa = mesa
	}
	if spec.compute != dtypes.Float32 {
		for n, node := range batch {
			if node.DType() == dtypes.Float32 && !isReferenceInput(n) {
				batch[n] = graph.ConvertDType(node, spec.compute)
			}
		}
	}
	var metrics []*graph.Node
	p.loss, metrics = objectiveLoss(spec, bound, batch)
	p.metrics = stackMetrics(metrics)
	p.grads = engine.Gradient(p.loss, p.train...)
	p.rng = rng.State()
	if mesa != nil {
		p.mesaOut = mesa.Out
		for _, in := range mesa.In {
			p.mesaShapes = append(p.mesaShapes, in.Shape())
		}
	}
	return p
}

// outputs lists the gradient computation's results: the loss, the gradients, the next RNG state and the
// updated Mesa states. They are what memory.Saved walks back from.
func (p gradParts) outputs() []*graph.Node {
	return append(append(append([]*graph.Node{p.loss}, p.grads...), p.rng), p.mesaOut...)
}

// checkBatch reports a batch input the model needs that spec lacks.
func checkBatch(spec stepSpec) error {
	want := batchInputs(spec.model, spec.config)
	for _, name := range want {
		if _, ok := spec.batch[name]; !ok {
			return fmt.Errorf("batch has no %q (the step needs %v)", name, want)
		}
	}
	return nil
}

// buildGradStep builds and compiles the gradient step alone: the parameters of buildGrad; its outputs are the
// loss, the gradient of every trainable tensor (float32, sorted by name), the next RNG state and the updated
// Mesa states. The Mesa states' shapes are returned too. The memory planner uses it (the trainer runs
// buildDeviceStep's programs, whose gradient part is this very graph).
func buildGradStep(backend compute.Backend, spec stepSpec) (*graph.Graph, []*graph.Node, []shapes.Shape, error) {
	if err := checkBatch(spec); err != nil {
		return nil, nil, nil, err
	}
	var g *graph.Graph
	var p gradParts
	err := engine.Try(func() {
		g = graph.NewGraph(backend, "train-step")
		p = buildGrad(g, spec)
		if err := g.Compile(p.outputs()...); err != nil {
			panic(err) // engine.Try returns it: the backend's cause
		}
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("building the training step: %w", err)
	}
	return g, p.outputs(), p.mesaShapes, nil
}

func batchSignature(b Batch) string { return b.Signature() }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
