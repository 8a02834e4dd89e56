package engine_test

import (
	"testing"

	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/memory"
)

// block is a small two-layer MLP with a nonlinearity, enough to keep several activations.
func block(in []*graph.Node) *graph.Node {
	x, w1, w2 := in[0], in[1], in[2]
	h := graph.Tanh(engine.Linear(x, w1, nil))
	return graph.Add(x, engine.Linear(graph.Mul(h, h), w2, nil))
}

// TestCheckpointGradients: a checkpointed stack has the same output and gradients as the plain one, and keeps
// only the blocks' inputs for the backward pass.
func TestCheckpointGradients(t *testing.T) {
	const n, d, m = 6, 8, 16
	x := gtest.Tensor(gtest.Rand(1, n*d, 1), n, d)
	w1 := gtest.Tensor(gtest.Rand(2, m*d, 0.3), m, d)
	w2 := gtest.Tensor(gtest.Rand(3, d*m, 0.3), d, m)
	w3 := gtest.Tensor(gtest.Rand(4, m*d, 0.3), m, d)
	w4 := gtest.Tensor(gtest.Rand(5, d*m, 0.3), d, m)
	saved := map[bool]*memory.SavedReport{}
	results := map[bool][][]float32{}
	for _, ckpt := range []bool{false, true} {
		var outputs []*graph.Node
		res, g := gtest.RunGraph(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			apply := func(in ...*graph.Node) *graph.Node {
				if ckpt {
					return engine.Checkpoint(block, in...)
				}
				return block(in)
			}
			h := apply(graph.Sin(p[0]), p[1], p[2])
			y := apply(h, p[3], p[4])
			loss := graph.ReduceAllSum(graph.Mul(y, y))
			outputs = append([]*graph.Node{loss}, engine.Gradient(loss, p...)...)
			return outputs
		}, x, w1, w2, w3, w4)
		results[ckpt] = res
		var err error
		if saved[ckpt], err = memory.Saved(g, outputs...); err != nil {
			t.Fatal(err)
		}
	}
	for i := range results[false] {
		if d := gtest.MaxRelDiff(results[true][i], results[false][i], 1e-3); d > 1e-5 {
			t.Errorf("output %d: checkpointed differs by %g", i, d)
		}
	}
	// Plain keeps per block x, tanh output, its square and h (several [n, m] tensors); checkpointed keeps the
	// block inputs (and the final output for the loss), no [n, m] tensor.
	if hidden := len(saved[true].Find(n, m)); hidden != 0 {
		t.Errorf("checkpointed stack keeps %d hidden [n, m] tensors, want 0: %+v", hidden, saved[true].Tensors)
	}
	if len(saved[false].Find(n, m)) == 0 {
		t.Error("plain stack keeps no hidden tensor: the test does not test anything")
	}
	if saved[true].Total >= saved[false].Total {
		t.Errorf("checkpointed keeps %d bytes, plain %d", saved[true].Total, saved[false].Total)
	}
}
