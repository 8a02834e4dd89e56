package attention

import (
	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// FlashSupported reports whether Flash would run the backend's fused attention for q [B, N, H*Dh] with the
// given heads and mask, and otherwise why not (Flash then computes MemoryEfficient). The conditions are the
// backend's: GoMLX's fused scaled-dot-product attention op and its fused backward, which the pure-Go backend
// does not have and XLA's CUDA plugin has (cuDNN flash attention, go-xla v0.4.13 compute/xla/flash.go (unchanged since v0.4.1):
// float16/bfloat16 inputs, head size a multiple of 8, query heads a multiple of the kv heads, padding given as
// per-batch sequence lengths, no materialised mask, so no packed sequences' segment ids); and memfit's: Mesa int8 storage (Mask.Keep) needs q, k, v
// as tensors of their own, so it runs MemoryEfficient. A backend may still refuse the call when the graph is
// built (another plugin, a version's limits): Flash then falls back as well.
func FlashSupported(q *graph.Node, heads, kvHeads int, mask Mask) (bool, string) {
	caps := q.Graph().Backend().Capabilities()
	switch {
	case !caps.Operations[compute.OpTypeFusedScaledDotProductAttention] || !caps.Operations[compute.OpTypeFusedScaledDotProductAttentionVJP]:
		return false, "the backend has no fused attention with a fused backward"
	case !q.DType().IsHalfPrecision():
		return false, "fused attention needs float16 or bfloat16 compute, got " + q.DType().String()
	case heads <= 0 || q.Shape().Dim(-1)%heads != 0 || (q.Shape().Dim(-1)/heads)%8 != 0:
		return false, "fused attention needs a head size that is a multiple of 8"
	case kvHeads <= 0 || heads%kvHeads != 0:
		return false, "fused attention needs query heads a multiple of the kv heads"
	case mask.Keep != nil:
		return false, "Mesa int8 storage of the attention inputs needs the unfused attention"
	case mask.SoftCap > 0:
		return false, "soft-capped scores need the unfused attention"
	case mask.Window > 0:
		return false, "a sliding window needs a materialised mask, which the fused op (causal mask and sequence lengths only) cannot take"
	case mask.Segments != nil:
		return false, "packed sequences need a block-diagonal mask, which the fused op (causal mask and sequence lengths only) cannot take"
	}
	return true, ""
}

// Flash is scaled dot-product attention through the backend's fused op (q, k, v and the result as in Standard):
// cuDNN's flash attention on XLA's CUDA plugin, whose forward keeps only its output and one log-sum-exp per
// query row and whose backward recomputes the probabilities tile by tile, so the [B, H, N, M] scores never
// exist in either pass. Its gradient is the op's registered fused backward (GoMLX's VJP), tagged as attention
// for the saved-activation accounting, which then counts what that backward reads: q, k, v (reshaped
// projections), the output and the log-sum-exp.
//
// The causal mask is the op's own; key padding is passed as per-batch sequence lengths (the count of real
// tokens of each row of Mask.KeyPadding), which is the same mask when the padding is on the right, as memfit's
// loaders and evaluations pad. Where FlashSupported says no, or the backend refuses the call, Flash computes
// MemoryEfficient, the same attention with the same saved tensors as memfit's own backward.
func Flash(q, k, v *graph.Node, heads, kvHeads int, mask Mask) *graph.Node {
	if ok, _ := FlashSupported(q, heads, kvHeads, mask); !ok {
		return MemoryEfficient(q, k, v, heads, kvHeads, mask)
	}
	l := newLayout(q, k, v, heads, kvHeads)
	q4 := graph.Reshape(q, l.b, l.n, heads, l.dh)
	k4 := graph.Reshape(k, l.b, l.m, kvHeads, l.dh)
	v4 := graph.Reshape(v, l.b, l.m, kvHeads, l.dh)
	cfg := &compute.ScaledDotProductAttentionConfig{Causal: mask.Causal}
	if mask.KeyPadding != nil {
		real := graph.ConvertDType(graph.NotEqual(mask.KeyPadding, graph.ScalarZero(q.Graph(), mask.KeyPadding.DType())), dtypes.Int32)
		lens := graph.ReduceSum(real, 1)
		cfg.QuerySeqLen = graph.InternalBackendOutputs(lens)[0]
		cfg.KeyValueSeqLen = cfg.QuerySeqLen
	}
	out, _ := graph.InternalFusedOpCaller(
		func() *graph.Node {
			o, states := graph.BackendFusedScaledDotProductAttention(q4, k4, v4, compute.AttentionAxesLayoutBSHD, cfg)
			for _, in := range o.Inputs() { // the fused node itself, when o is one of its split outputs
				if in.Type() == graph.NodeTypeFusedScaledDotProductAttention {
					engine.SetKind(in, engine.KindAttention)
				}
			}
			for _, st := range states { // the log-sum-exp its backward reads
				engine.SetKind(st, engine.KindAttention)
			}
			return engine.SetKind(o, engine.KindAttention)
		},
		func() *graph.Node {
			return graph.Reshape(MemoryEfficient(q, k, v, heads, kvHeads, mask), l.b, l.n, heads, l.dh)
		},
		false)
	return graph.Reshape(out, l.b, l.n, l.d)
}
