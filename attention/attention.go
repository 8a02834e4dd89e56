// Package attention builds multi-head attention from engine's matmul helpers, with a softmax whose backward
// keeps only the probabilities.
package attention

import (
	"fmt"
	"math"

	"github.com/gomlx/gomlx/pkg/core/graph"

	"github.com/memfit/memfit/engine"
)

// Softmax returns softmax(x) over the last axis.
//
// Backward. With p = softmax(x) and g = dL/dp: dp_j/dx_i = p_j (delta_ij - p_i), so
//
//	dL/dx_i = sum_j g_j p_j (delta_ij - p_i) = p_i (g_i - sum_j g_j p_j)
//
// which reads only p (this node's output). The max subtraction and the exponential pass that gradient straight
// to x, so neither exp(x - max) nor x is kept (GoMLX's own gradient keeps both exp and p).
func Softmax(x *graph.Node) *graph.Node {
	m := graph.StopGradient(graph.ReduceAndKeep(x, graph.ReduceMax, -1))
	shifted := engine.PassThrough(graph.Sub(x, m), engine.KindAttention, 0)
	e := engine.PassThrough(graph.Exp(shifted), engine.KindAttention, 0)
	p := graph.Div(e, graph.ReduceAndKeep(e, graph.ReduceSum, -1))
	return engine.SetVJP(p, engine.KindAttention, func(p, g *graph.Node) []*graph.Node {
		dot := graph.ReduceAndKeep(graph.Mul(g, p), graph.ReduceSum, -1)
		return []*graph.Node{graph.Mul(p, graph.Sub(g, dot)), nil}
	})
}

// Standard is multi-head scaled dot-product attention that keeps the probabilities for the backward pass.
//
// q is [B, N, H*Dh]; k and v are [B, M, Hkv*Dh] with H a multiple of Hkv (grouped-query attention when
// Hkv < H; pass Hkv = H for plain multi-head attention). mask, if not nil, is added to the scores and must
// broadcast (size-1 axes) to [B, H, N, M]: 0 where attention is allowed and a large negative number where it is
// not. The result is [B, N, H*Dh].
//
// Kept for the backward pass: the scaled q and k (score product), the probabilities (softmax and value product,
// one tensor) and v, as [B, N, H, Dh] views of the projections.
func Standard(q, k, v *graph.Node, heads, kvHeads int, mask *graph.Node) *graph.Node {
	b, n, d := q.Shape().Dim(0), q.Shape().Dim(1), q.Shape().Dim(2)
	m := k.Shape().Dim(1)
	if heads <= 0 || kvHeads <= 0 || d%heads != 0 || heads%kvHeads != 0 {
		panic(fmt.Sprintf("attention: %d heads and %d kv heads do not fit hidden size %d", heads, kvHeads, d))
	}
	dh := d / heads
	if k.Shape().Dim(2) != kvHeads*dh || v.Shape().Dim(2) != kvHeads*dh || v.Shape().Dim(1) != m {
		panic(fmt.Sprintf("attention: k %s / v %s do not match %d kv heads of size %d", k.Shape(), v.Shape(), kvHeads, dh))
	}
	group := heads / kvHeads
	// q: [B, N, Hkv, G, Dh] scaled by 1/sqrt(Dh); k, v: [B, M, Hkv, Dh].
	q5 := graph.MulScalar(graph.Reshape(q, b, n, kvHeads, group, dh), 1/math.Sqrt(float64(dh)))
	engine.SetKind(q5, engine.KindAttention)
	k4 := graph.Reshape(k, b, m, kvHeads, dh)
	v4 := graph.Reshape(v, b, m, kvHeads, dh)
	// Scores [B, Hkv, N, G, M]: batch over B and the kv head, contract Dh.
	scores := engine.SetKind(engine.DotGeneral(q5, []int{4}, []int{0, 2}, k4, []int{3}, []int{0, 2}), engine.KindAttention)
	if mask != nil {
		scores = engine.SetKind(graph.Add(scores, groupMask(mask, b, heads, kvHeads, n, m)), engine.KindAttention)
	}
	probs := Softmax(scores)
	// Context [B, Hkv, N, G, Dh]: batch over B and the kv head, contract M.
	ctx := engine.SetKind(engine.DotGeneral(probs, []int{4}, []int{0, 1}, v4, []int{1}, []int{0, 2}), engine.KindAttention)
	// Back to [B, N, Hkv, G, Dh] = [B, N, H*Dh].
	return graph.Reshape(graph.TransposeAllDims(ctx, 0, 2, 1, 3, 4), b, n, d)
}

// groupMask reshapes a mask that broadcasts to [B, H, N, M] into the [B, Hkv, N, G, M] layout of the scores.
func groupMask(mask *graph.Node, b, heads, kvHeads, n, m int) *graph.Node {
	if mask.Rank() != 4 {
		panic(fmt.Sprintf("attention: mask must be rank 4 ([B|1, H|1, N|1, M]), got %s", mask.Shape()))
	}
	md := mask.Shape().Dimensions
	if md[1] == 1 {
		return graph.InsertAxes(mask, 3) // [B, 1, N, 1, M]
	}
	if md[1] != heads {
		panic(fmt.Sprintf("attention: mask head axis %d, want 1 or %d", md[1], heads))
	}
	return graph.Reshape(graph.TransposeAllDims(graph.Reshape(mask, md[0], kvHeads, heads/kvHeads, md[2], md[3]), 0, 1, 3, 2, 4),
		md[0], kvHeads, md[2], heads/kvHeads, md[3])
}
