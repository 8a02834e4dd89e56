package vit_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
)

func TestGoldenImageClassification(t *testing.T) {
	g := golden.Load(t, "vit_a")
	pixels := g.Array(t, "inputs", "pixel_values")
	labels := g.Array(t, "labels")
	pixelsT := tensors.FromFlatDataAndDimensions(pixels.Float32s(), pixels.Dims...)
	labelsT := tensors.FromFlatDataAndDimensions(labels.Int32s(), labels.Dims...)
	gradNames := g.Keys(t, "grads")
	for _, approx := range []bool{false, true} {
		for _, ms := range []bool{false, true} {
			for _, kind := range []attention.Kind{attention.KindStandard, attention.KindMemoryEfficient} {
				t.Run(fmt.Sprintf("approx=%v,ms=%v,%s", approx, ms, kind), func(t *testing.T) {
					m, err := vit.Load(g.Dir, vit.Options{ApproxActivation: approx, MSNorm: ms, Attention: kind})
					if err != nil {
						t.Fatal(err)
					}
					exact := !approx && !ms
					var nHidden int
					var hasLast bool
					values, _ := gtest.RunBuilt(t, func(gr *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
						px := graph.Parameter(gr, "pixel_values", pixelsT.Shape())
						lb := graph.Parameter(gr, "labels", labelsT.Shape())
						b := models.Bind(gr, m.Params)
						out := m.Forward(b, px)
						l := loss.CrossEntropy(out.Logits, lb, loss.IgnoreIndex)
						outputs := []*graph.Node{out.Logits, l}
						if exact {
							wrt := make([]*graph.Node, len(gradNames))
							for i, n := range gradNames {
								wrt[i] = b.Node(n)
							}
							outputs = append(outputs, engine.Gradient(l, wrt...)...)
						}
						outputs = append(outputs, out.Hidden...)
						nHidden = len(out.Hidden)
						if out.LastHidden != nil {
							outputs = append(outputs, out.LastHidden)
							hasLast = true
						}
						return outputs, append([]*tensors.Tensor{pixelsT, labelsT}, b.Inputs(m.Params)...)
					})
					d := golden.RelMaxDiff(values[0], g.Array(t, "outputs", "logits").Float32s())
					lossDiff := math.Abs(float64(values[1][0]) - g.Array(t, "outputs", "loss").Values[0])
					t.Logf("logits rel diff %.2g, loss diff %.2g", d, lossDiff)
					if d > 1e-4 || lossDiff > 1e-5 {
						t.Errorf("logits rel diff %g, loss diff %g", d, lossDiff)
					}
					next := 2
					if exact {
						for i, n := range gradNames {
							d := golden.RelMaxDiff(values[2+i], g.Array(t, "grads", n).Float32s())
							t.Logf("grad %s rel diff %.2g", n, d)
							if d > 1e-4 {
								t.Errorf("gradient of %s differs by %g (relative)", n, d)
							}
						}
						next += len(gradNames)
					}
					for i := 0; i < nHidden; i++ {
						want := g.Array(t, "outputs", "hidden_states", fmt.Sprint(i)).Float32s()
						if d := golden.RelMaxDiff(values[next+i], want); d > 1e-4 {
							t.Errorf("hidden state %d differs by %g (relative)", i, d)
						}
					}
					if ms == hasLast {
						t.Errorf("last hidden state present=%v with ms=%v: want it exactly when the final norm is not folded", hasLast, ms)
					}
					if hasLast {
						if d := golden.RelMaxDiff(values[next+nHidden], g.Array(t, "outputs", "last_hidden_state").Float32s()); d > 1e-4 {
							t.Errorf("last hidden state differs by %g (relative)", d)
						}
					}
				})
			}
		}
	}
}

// TestPositionInterpolation: a larger image runs (position embeddings interpolated bicubically, see
// TestBicubicWeights for the interpolation itself), yields one token per patch, and gradients reach the stored
// position embeddings through the interpolation.
func TestPositionInterpolation(t *testing.T) {
	cfg, _ := vit.Preset("tiny", 3)
	params := vit.RandomParams(cfg, 4)
	m, err := vit.New(cfg, params, vit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	px := gtest.Tensor(gtest.Rand(1, 1*3*48*48, 1), 1, 3, 48, 48) // 6x6 patches instead of 4x4
	values, _ := gtest.RunBuilt(t, func(gr *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
		pxN := graph.Parameter(gr, "pixel_values", px.Shape())
		b := models.Bind(gr, m.Params)
		out := m.Forward(b, pxN)
		grad := engine.Gradient(graph.ReduceAllSum(out.Logits), b.Node(vit.PositionEmbedding))
		return []*graph.Node{out.Hidden[0], grad[0]}, append([]*tensors.Tensor{px}, b.Inputs(m.Params)...)
	})
	if len(values[0]) != 37*cfg.HiddenSize {
		t.Fatalf("embeddings have %d values, want 37 tokens", len(values[0]))
	}
	var nonzero bool
	for _, v := range values[1] {
		nonzero = nonzero || v != 0
	}
	if !nonzero {
		t.Error("no gradient reached the position embeddings")
	}
}
