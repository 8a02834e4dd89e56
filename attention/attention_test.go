package attention_test

import (
	"math"
	"testing"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
)

// reference computes attention head by head with plain GoMLX ops (its own softmax, einsum and autodiff; slices
// use engine.SliceAxis because GoMLX's slice gradient needs Pad, which the pure-Go backend lacks).
func reference(q, k, v *graph.Node, heads, kvHeads int, mask *graph.Node) *graph.Node {
	b, n, d := q.Shape().Dim(0), q.Shape().Dim(1), q.Shape().Dim(2)
	m := k.Shape().Dim(1)
	dh := d / heads
	q4 := graph.Reshape(q, b, n, heads, dh)
	k4 := graph.Reshape(k, b, m, kvHeads, dh)
	v4 := graph.Reshape(v, b, m, kvHeads, dh)
	var outs []*graph.Node
	for h := 0; h < heads; h++ {
		kv := h / (heads / kvHeads)
		qh := graph.Reshape(engine.SliceAxis(q4, 2, h, h+1), b, n, dh)
		kh := graph.Reshape(engine.SliceAxis(k4, 2, kv, kv+1), b, m, dh)
		vh := graph.Reshape(engine.SliceAxis(v4, 2, kv, kv+1), b, m, dh)
		s := graph.MulScalar(graph.Einsum("bnd,bmd->bnm", qh, kh), 1/math.Sqrt(float64(dh)))
		if mask != nil {
			mh := mask
			if mask.Shape().Dim(1) != 1 {
				mh = engine.SliceAxis(mask, 1, h, h+1)
			}
			s = graph.Add(s, graph.Reshape(mh, mh.Shape().Dim(0), mh.Shape().Dim(2), mh.Shape().Dim(3)))
		}
		p := graph.Softmax(s, -1)
		outs = append(outs, graph.Einsum("bnm,bmd->bnd", p, vh))
	}
	return graph.Concatenate(outs, -1)
}

// TestStandardMatchesReference checks output and q/k/v gradients of multi-head and grouped-query attention,
// with and without a causal mask, against GoMLX's own ops and autodiff.
func TestStandardMatchesReference(t *testing.T) {
	const b, n, dh = 2, 5, 4
	for _, tc := range []struct {
		name           string
		heads, kv      int
		causal, heads1 bool
	}{{"mha", 3, 3, false, false}, {"gqa-causal", 4, 2, true, false}, {"mqa-causal-per-head-mask", 4, 1, true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			q := gtest.Tensor(gtest.Rand(1, b*n*tc.heads*dh, 1), b, n, tc.heads*dh)
			k := gtest.Tensor(gtest.Rand(2, b*n*tc.kv*dh, 1), b, n, tc.kv*dh)
			v := gtest.Tensor(gtest.Rand(3, b*n*tc.kv*dh, 1), b, n, tc.kv*dh)
			r := gtest.Tensor(gtest.Rand(4, b*n*tc.heads*dh, 1), b, n, tc.heads*dh)
			mh := 1
			if tc.heads1 {
				mh = tc.heads
			}
			maskData := make([]float32, mh*n*n)
			for h := 0; h < mh; h++ {
				for i := 0; i < n; i++ {
					for j := 0; j < n; j++ {
						if tc.causal && j > i {
							maskData[(h*n+i)*n+j] = -1e9
						}
					}
				}
			}
			mask := tensors.FromFlatDataAndDimensions(maskData, 1, mh, n, n)
			build := func(fn func(q, k, v *graph.Node, heads, kv int, mask *graph.Node) *graph.Node) func(*graph.Graph, []*graph.Node) []*graph.Node {
				return func(g *graph.Graph, p []*graph.Node) []*graph.Node {
					var m *graph.Node
					if tc.causal {
						m = p[4]
					}
					out := fn(p[0], p[1], p[2], tc.heads, tc.kv, m)
					grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(out, p[3])), p[0], p[1], p[2])
					return append([]*graph.Node{out}, grads...)
				}
			}
			want := gtest.Run(t, build(reference), q, k, v, r, mask)
			got := gtest.Run(t, build(attention.Standard), q, k, v, r, mask)
			for i, name := range []string{"output", "dq", "dk", "dv"} {
				if d := gtest.MaxAbsDiff(got[i], want[i]); d > 2e-6 {
					t.Errorf("%s: max |diff| %g", name, d)
				}
			}
		})
	}
}

// TestSoftmaxGradient checks the one-tensor softmax backward against GoMLX's softmax.
func TestSoftmaxGradient(t *testing.T) {
	x := gtest.Tensor(gtest.Rand(5, 6*7, 3), 6, 7)
	r := gtest.Tensor(gtest.Rand(6, 6*7, 1), 6, 7)
	build := func(sm func(*graph.Node) *graph.Node) func(*graph.Graph, []*graph.Node) []*graph.Node {
		return func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := sm(p[0])
			return append([]*graph.Node{y}, engine.Gradient(graph.ReduceAllSum(graph.Mul(y, p[1])), p[0])...)
		}
	}
	want := gtest.Run(t, build(func(x *graph.Node) *graph.Node { return graph.Softmax(x, -1) }), x, r)
	got := gtest.Run(t, build(attention.Softmax), x, r)
	for i := range want {
		if d := gtest.MaxAbsDiff(got[i], want[i]); d > 1e-6 {
			t.Errorf("output %d: max |diff| %g", i, d)
		}
	}
}
