package attention_test

import (
	"github.com/gomlx/compute"
	"math"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/memory"
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
			s = graph.Add(s, graph.Reshape(mask, mask.Shape().Dim(0), mask.Shape().Dim(2), mask.Shape().Dim(3)))
		}
		p := graph.Softmax(s, -1)
		outs = append(outs, graph.Einsum("bnm,bmd->bnd", p, vh))
	}
	return graph.Concatenate(outs, -1)
}

// TestAttentionMatchesReference checks output and q/k/v gradients of both attention kinds, multi-head and
// grouped-query, with causal and padding masks, with and without the backend's fused softmax, against GoMLX's own
// ops and autodiff. The segments cases are packed rows (Mask.Segments): a block-diagonal (causal) mask.
func TestAttentionMatchesReference(t *testing.T) {
	const b, n, dh = 2, 5, 4
	for _, tc := range []struct {
		name            string
		heads, kv       int
		causal, padding bool
		segments        bool
	}{{"mha", 3, 3, false, false, false}, {"gqa-causal", 4, 2, true, false, false}, {"mqa-causal-padding", 4, 1, true, true, false},
		{"mha-padding", 2, 2, false, true, false}, {"gqa-causal-segments", 4, 2, true, false, true}, {"mqa-causal-padding-segments", 4, 1, true, true, true},
		{"mha-segments", 2, 2, false, false, true}} {
		for _, kf := range []struct {
			kind   attention.Kind
			fusion string
		}{{attention.KindStandard, "1"}, {attention.KindMemoryEfficient, "1"}, {attention.KindStandard, "0"}, {attention.KindMemoryEfficient, "0"},
			{attention.KindFlash, "1"}} {
			kind := kf.kind
			// GOMLX_FUSION=0: the plain-ops softmax that backends without a fused one (XLA) get.
			t.Run(tc.name+"/"+kind.String()+"/fusion="+kf.fusion, func(t *testing.T) {
				q := gtest.Tensor(gtest.Rand(1, b*n*tc.heads*dh, 1), b, n, tc.heads*dh)
				k := gtest.Tensor(gtest.Rand(2, b*n*tc.kv*dh, 1), b, n, tc.kv*dh)
				v := gtest.Tensor(gtest.Rand(3, b*n*tc.kv*dh, 1), b, n, tc.kv*dh)
				r := gtest.Tensor(gtest.Rand(4, b*n*tc.heads*dh, 1), b, n, tc.heads*dh)
				// Row 1 has 3 real keys then 2 padding keys.
				padding := tensors.FromFlatDataAndDimensions([]int32{1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, b, n)
				// Packed rows: documents at 0-2 and 3-4 in row 0, 0-1 and 2-4 in row 1 (each token's segment id is
				// its document's first index).
				segData := []int32{0, 0, 0, 3, 3, 0, 0, 2, 2, 2}
				segments := tensors.FromFlatDataAndDimensions(segData, b, n)
				maskData := make([]float32, b*n*n)
				for bi := 0; bi < b; bi++ {
					for i := 0; i < n; i++ {
						for j := 0; j < n; j++ {
							if (tc.causal && j > i) || (tc.padding && bi == 1 && j >= 3) || (tc.segments && segData[bi*n+i] != segData[bi*n+j]) {
								maskData[(bi*n+i)*n+j] = -1e9
							}
						}
					}
				}
				additive := tensors.FromFlatDataAndDimensions(maskData, b, 1, n, n)
				// The reference's graph.Softmax is built from plain ops: engine.Gradient cannot differentiate GoMLX's
				// fused softmax, whose gradient GoMLX takes from a decomposed alternate it does not export.
				t.Setenv(graph.FusionEnv, "0")
				want := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
					out := reference(p[0], p[1], p[2], tc.heads, tc.kv, p[5])
					grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(out, p[3])), p[0], p[1], p[2])
					return append([]*graph.Node{out}, grads...)
				}, q, k, v, r, padding, additive, segments)
				t.Setenv(graph.FusionEnv, kf.fusion)
				got := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
					mask := attention.Mask{Causal: tc.causal}
					if tc.padding {
						mask.KeyPadding = p[4]
					}
					if tc.segments {
						mask.Segments = p[6]
					}
					out := attention.Attention(kind, p[0], p[1], p[2], tc.heads, tc.kv, mask)
					grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(out, p[3])), p[0], p[1], p[2])
					return append([]*graph.Node{out}, grads...)
				}, q, k, v, r, padding, additive, segments)
				for i, name := range []string{"output", "dq", "dk", "dv"} {
					if d := gtest.MaxAbsDiff(got[i], want[i]); d > 2e-6 {
						t.Errorf("%s: max |diff| %g", name, d)
					}
				}
			})
		}
	}
}

// TestMemoryEfficientKeepsNoScores: the memory-efficient kind keeps no tensor with a key axis (no
// probabilities, no scores), only q, k, v and one log-sum-exp per row; the standard kind keeps the
// probabilities.
func TestMemoryEfficientKeepsNoScores(t *testing.T) {
	const b, n, heads, dh = 2, 6, 4, 8
	q := gtest.Tensor(gtest.Rand(1, b*n*heads*dh, 1), b, n, heads*dh)
	for _, kind := range []attention.Kind{attention.KindStandard, attention.KindMemoryEfficient} {
		var outputs []*graph.Node
		_, g := gtest.RunGraph(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			out := attention.Attention(kind, p[0], p[1], p[2], heads, heads, attention.Mask{Causal: true})
			outputs = engine.Gradient(graph.ReduceAllSum(graph.Mul(out, p[0])), p[0], p[1], p[2])
			return outputs
		}, q, q, q)
		saved, err := memory.Saved(g, outputs...)
		if err != nil {
			t.Fatal(err)
		}
		var withKeys, lse int
		for _, s := range saved.Tensors {
			dims := s.Shape.Dimensions
			if len(dims) == 5 && dims[4] == n && dims[2] == n {
				withKeys++
			}
			if len(dims) == 5 && dims[4] == 1 {
				lse++
			}
		}
		switch kind {
		case attention.KindStandard:
			if withKeys != 1 {
				t.Errorf("standard: %d saved [.., N, .., M] tensors, want 1 (the probabilities): %+v", withKeys, saved.Tensors)
			}
		case attention.KindMemoryEfficient:
			// With the backend's fused softmax the probabilities are recomputed from the scores alone and no
			// log-sum-exp is kept either.
			wantLSE := 1
			if engine.Fused(outputs[0], compute.OpTypeFusedSoftmax) {
				wantLSE = 0
			}
			if withKeys != 0 || lse != wantLSE {
				t.Errorf("memory-efficient: %d saved score-shaped tensors (want 0), %d per-row tensors (want %d, the lse): %+v", withKeys, lse, wantLSE, saved.Tensors)
			}
		}
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
	t.Setenv(graph.FusionEnv, "0") // GoMLX's softmax from plain ops (see TestAttentionMatchesReference)
	want := gtest.Run(t, build(func(x *graph.Node) *graph.Node { return graph.Softmax(x, -1) }), x, r)
	for _, fusion := range []string{"1", "0"} { // the backend's fused softmax, and plain ops
		t.Setenv(graph.FusionEnv, fusion)
		got := gtest.Run(t, build(attention.Softmax), x, r)
		for i := range want {
			if d := gtest.MaxAbsDiff(got[i], want[i]); d > 1e-6 {
				t.Errorf("fusion=%s output %d: max |diff| %g", fusion, i, d)
			}
		}
	}
}

// TestFlashOnTheGoBackend: "flash" parses to KindFlash and prints back; the pure-Go backend has no fused
// attention, so FlashSupported says why and Flash builds the memory-efficient attention: the same saved tensors
// (its results are checked against the reference in TestAttentionMatchesReference).
func TestFlashOnTheGoBackend(t *testing.T) {
	for _, s := range []string{"standard", "memory-efficient", "flash"} {
		k, err := attention.ParseKind(s)
		if err != nil || k.String() != s {
			t.Errorf("ParseKind(%q) = %v, %v", s, k, err)
		}
	}
	if _, err := attention.ParseKind("fast"); err == nil || !strings.Contains(err.Error(), "flash") {
		t.Errorf("ParseKind(fast): %v", err)
	}
	const b, n, heads, dh = 2, 6, 4, 8
	q := gtest.Tensor(gtest.Rand(1, b*n*heads*dh, 1), b, n, heads*dh)
	saved := map[attention.Kind]int64{}
	for _, kind := range []attention.Kind{attention.KindMemoryEfficient, attention.KindFlash} {
		var outputs []*graph.Node
		_, g := gtest.RunGraph(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			if ok, why := attention.FlashSupported(p[0], heads, heads, attention.Mask{}); ok || !strings.Contains(why, "no fused attention") {
				t.Errorf("FlashSupported on the Go backend: %v, %q", ok, why)
			}
			out := attention.Attention(kind, p[0], p[1], p[2], heads, heads, attention.Mask{Causal: true})
			outputs = engine.Gradient(graph.ReduceAllSum(graph.Mul(out, p[0])), p[0], p[1], p[2])
			return outputs
		}, q, q, q)
		rep, err := memory.Saved(g, outputs...)
		if err != nil {
			t.Fatal(err)
		}
		saved[kind] = rep.Total
	}
	if saved[attention.KindFlash] != saved[attention.KindMemoryEfficient] || saved[attention.KindFlash] == 0 {
		t.Errorf("saved bytes: flash %d, memory-efficient %d", saved[attention.KindFlash], saved[attention.KindMemoryEfficient])
	}
}
