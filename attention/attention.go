// Package attention builds multi-head attention from engine's matmul helpers, with a softmax whose backward
// keeps only the probabilities.
package attention

import (
	"fmt"
	"math"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

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
//
// Where the backend has a fused softmax (the pure-Go one: one pass with a fast float32 exp, against five ops
// with math.Exp), the forward value is that op's and the backward is the same.
func Softmax(x *graph.Node) *graph.Node {
	if engine.Fused(x, compute.OpTypeFusedSoftmax) {
		p := graph.BackendFusedSoftmax(x, x.Rank()-1)
		return engine.SetVJP(p, engine.KindAttention, func(p, g *graph.Node) []*graph.Node {
			return []*graph.Node{softmaxGrad(engine.Fresh(p), g)} // an int8 copy of p under Mesa
		})
	}
	m := graph.StopGradient(graph.ReduceAndKeep(x, graph.ReduceMax, -1))
	shifted := engine.PassThrough(graph.Sub(x, m), engine.KindAttention, 0)
	e := engine.PassThrough(graph.Exp(shifted), engine.KindAttention, 0)
	p := graph.Div(e, graph.ReduceAndKeep(e, graph.ReduceSum, -1))
	return engine.SetVJP(p, engine.KindAttention, func(p, g *graph.Node) []*graph.Node {
		return []*graph.Node{softmaxGrad(engine.Fresh(p), g), nil} // an int8 copy of p under Mesa
	})
}

// softmaxGrad is p (g - sum(g p)) over the last axis: the softmax's input gradient from its output p and output
// gradient g (see Softmax).
func softmaxGrad(p, g *graph.Node) *graph.Node {
	dot := graph.ReduceAndKeep(graph.Mul(g, p), graph.ReduceSum, -1)
	return graph.Mul(p, graph.Sub(g, dot))
}

// Kind chooses how attention is computed and what its backward pass keeps.
type Kind int

// The attention kinds.
const (
	// KindStandard keeps the attention probabilities for the backward pass.
	KindStandard Kind = iota
	// KindMemoryEfficient keeps q, k, v and one log-sum-exp per row, and recomputes the probabilities in the
	// backward pass, as FlashAttention does.
	KindMemoryEfficient
	// KindFlash is the backend's fused scaled-dot-product attention with its fused backward (cuDNN flash
	// attention on XLA's CUDA plugin, bfloat16), falling back to KindMemoryEfficient where the backend has no
	// such op or cannot take the call (see Flash).
	KindFlash
)

// String returns "standard", "memory-efficient" or "flash".
func (k Kind) String() string {
	switch k {
	case KindMemoryEfficient:
		return "memory-efficient"
	case KindFlash:
		return "flash"
	}
	return "standard"
}

// ParseKind parses "standard", "memory-efficient" (also "mea") or "flash".
func ParseKind(s string) (Kind, error) {
	switch s {
	case "", "standard", "eager":
		return KindStandard, nil
	case "memory-efficient", "mea":
		return KindMemoryEfficient, nil
	case "flash":
		return KindFlash, nil
	}
	return 0, fmt.Errorf("unknown attention kind %q: use standard, memory-efficient or flash", s)
}

// Mask says which keys each query may attend to. The zero value lets every query see every key.
type Mask struct {
	// Causal lets query i see only keys j <= i (queries and keys are the same positions), or j <= Offset + i
	// when Offset is set.
	Causal bool
	// Offset, when not nil, is a scalar integer: the key position of the first query. Decoding with a key/value
	// cache sets it, the queries being the last tokens written into a cache of more keys than queries.
	Offset *graph.Node
	// KeyPadding, if not nil, is [B, M] with a non-zero value for real keys and 0 for padding; padding keys are
	// hidden from every query.
	KeyPadding *graph.Node
	// Window, when positive, hides keys more than Window-1 positions before the query (sliding-window attention:
	// query i sees keys j with i - Window < j; Mistral, the sliding layers of Gemma and Qwen). With Causal, a
	// query sees its own position and the Window-1 before it.
	Window int
	// SoftCap, when positive, caps the scaled scores as cap * tanh(scores / cap) before the mask is added (Gemma
	// 2's attention logit soft-capping).
	SoftCap float64
	// Segments, if not nil, is [B, N] integer segment ids of self-attention over packed sequences (queries and
	// keys the same positions): a query sees only the keys of its own segment, so attention does not cross the
	// documents packed into one row (a block-diagonal mask; with Causal, block-diagonal causal).
	Segments *graph.Node
	// Keep, when set, is given the tensors the backward pass keeps ("attn": the matmul operands q, k, v;
	// "softmax": the probabilities) with their head axis, and may return them marked for cheaper storage
	// (quant.Mesa stores them as int8).
	Keep func(kind string, x *graph.Node, headAxis int) *graph.Node
}

// recomputed returns the mask with its key padding read through engine.Recompute, for rebuilding the additive
// mask in a backward function without the backend merging it with the forward one.
func (m Mask) recomputed() Mask {
	if m.KeyPadding != nil {
		m.KeyPadding = engine.Recompute(m.KeyPadding)[0]
	}
	if m.Offset != nil {
		m.Offset = engine.Recompute(m.Offset)[0]
	}
	if m.Segments != nil {
		m.Segments = engine.Recompute(m.Segments)[0]
	}
	return m
}

func (m Mask) keep(kind string, x *graph.Node, headAxis int) *graph.Node {
	if m.Keep == nil {
		return x
	}
	return m.Keep(kind, x, headAxis)
}

// maskValue is added to the scores of hidden keys: exp of it underflows to exactly 0 in float32 and bfloat16.
const maskValue = -1e9

// additive builds the mask as [B|1, 1, N|1, M] zeros and maskValue (nil when nothing is hidden), from the
// mask's inputs alone, so a backward pass can rebuild it instead of keeping it.
func (m Mask) additive(g *graph.Graph, dtype dtypes.DType, n, keys int) *graph.Node {
	var allowed *graph.Node // boolean, broadcastable to [B, 1, N, M]
	if m.Causal {
		shape := shapes.Make(dtypes.Int32, 1, 1, n, keys)
		query := graph.Iota(g, shape, 2)
		if m.Offset != nil {
			query = graph.Add(query, graph.ConvertDType(m.Offset, dtypes.Int32))
		} else if n != keys {
			panic(fmt.Sprintf("attention: a causal mask needs as many queries as keys (or an offset), got %d and %d", n, keys))
		}
		allowed = graph.LessOrEqual(graph.Iota(g, shape, 3), query)
	}
	if m.Window > 0 {
		shape := shapes.Make(dtypes.Int32, 1, 1, n, keys)
		query := graph.Iota(g, shape, 2)
		if m.Offset != nil {
			query = graph.Add(query, graph.ConvertDType(m.Offset, dtypes.Int32))
		}
		// key > query - Window
		near := graph.GreaterThan(graph.Iota(g, shape, 3), graph.AddScalar(query, float64(-m.Window)))
		if allowed == nil {
			allowed = near
		} else {
			allowed = graph.LogicalAnd(allowed, near)
		}
	}
	if m.KeyPadding != nil {
		kp := m.KeyPadding
		if kp.Rank() != 2 || kp.Shape().Dim(1) != keys {
			panic(fmt.Sprintf("attention: key padding must be [B, %d], got %s", keys, kp.Shape()))
		}
		real := graph.NotEqual(kp, graph.ScalarZero(g, kp.DType()))
		real = graph.Reshape(real, kp.Shape().Dim(0), 1, 1, keys)
		if allowed == nil {
			allowed = real
		} else {
			allowed = graph.LogicalAnd(allowed, real)
		}
	}
	if m.Segments != nil {
		seg := m.Segments
		if seg.Rank() != 2 || seg.Shape().Dim(1) != n || n != keys {
			panic(fmt.Sprintf("attention: segment ids must be [B, %d] with as many keys as queries, got %s for %d keys", n, seg.Shape(), keys))
		}
		b := seg.Shape().Dim(0)
		same := graph.Equal(graph.Reshape(seg, b, 1, n, 1), graph.Reshape(seg, b, 1, 1, keys))
		if allowed == nil {
			allowed = same
		} else {
			allowed = graph.LogicalAnd(allowed, same)
		}
	}
	if allowed == nil {
		return nil
	}
	zero := graph.ScalarZero(g, dtype)
	hidden := graph.Scalar(g, dtype, maskValue)
	dims := allowed.Shape().Clone()
	dims.DType = dtype
	return graph.Where(allowed, graph.BroadcastToShape(zero, dims), graph.BroadcastToShape(hidden, dims))
}

// Attention applies attention of the given kind; see Standard for the shapes.
func Attention(kind Kind, q, k, v *graph.Node, heads, kvHeads int, mask Mask) *graph.Node {
	switch kind {
	case KindMemoryEfficient:
		return MemoryEfficient(q, k, v, heads, kvHeads, mask)
	case KindFlash:
		return Flash(q, k, v, heads, kvHeads, mask)
	}
	return Standard(q, k, v, heads, kvHeads, mask)
}

// layout holds the grouped-query shapes of one attention call.
type layout struct {
	b, n, m, d, heads, kvHeads, group, dh int
}

func newLayout(q, k, v *graph.Node, heads, kvHeads int) layout {
	l := layout{b: q.Shape().Dim(0), n: q.Shape().Dim(1), d: q.Shape().Dim(2), m: k.Shape().Dim(1), heads: heads, kvHeads: kvHeads}
	if q.Rank() != 3 || k.Rank() != 3 || v.Rank() != 3 {
		panic(fmt.Sprintf("attention: q, k, v must be [B, N, H*Dh], got %s, %s, %s", q.Shape(), k.Shape(), v.Shape()))
	}
	if heads <= 0 || kvHeads <= 0 || l.d%heads != 0 || heads%kvHeads != 0 {
		panic(fmt.Sprintf("attention: %d heads and %d kv heads do not fit hidden size %d", heads, kvHeads, l.d))
	}
	l.dh = l.d / heads
	l.group = heads / kvHeads
	if k.Shape().Dim(2) != kvHeads*l.dh || v.Shape().Dim(2) != kvHeads*l.dh || v.Shape().Dim(1) != l.m {
		panic(fmt.Sprintf("attention: k %s / v %s do not match %d kv heads of size %d", k.Shape(), v.Shape(), kvHeads, l.dh))
	}
	return l
}

// split returns q as [B, Hkv, N, G, Dh] scaled by 1/sqrt(Dh), and k, v as [B, Hkv, M, Dh]: head-major, so that
// every product of the forward and backward passes reaches the backend's matmul kernels in a layout they take
// without copying (batch axes first, then cross, then contracting on the left). One transpose each here (their
// gradients transpose back) replaces the copies the backend would make for every product that reads them:
// measured on the scaled ViT's full fine-tuning step, the attention's transposes went from 15 tensors of the
// projection's size and one of the scores' size per layer to 12 of the projection's size.
func (l layout) split(q, k, v *graph.Node) (qh, kh, vh *graph.Node) {
	q5 := graph.MulScalar(graph.Reshape(q, l.b, l.n, l.kvHeads, l.group, l.dh), 1/math.Sqrt(float64(l.dh)))
	qh = engine.SetKind(graph.TransposeAllDims(q5, 0, 2, 1, 3, 4), engine.KindAttention)
	kh = engine.SetKind(graph.TransposeAllDims(graph.Reshape(k, l.b, l.m, l.kvHeads, l.dh), 0, 2, 1, 3), engine.KindAttention)
	vh = engine.SetKind(graph.TransposeAllDims(graph.Reshape(v, l.b, l.m, l.kvHeads, l.dh), 0, 2, 1, 3), engine.KindAttention)
	return
}

// scores returns qh·khᵀ as [B, Hkv, N, G, M] (batch over B and the kv head, contract Dh).
func scores(qh, kh *graph.Node) *graph.Node {
	return engine.SetKind(engine.DotGeneral(qh, []int{4}, []int{0, 1}, kh, []int{3}, []int{0, 1}), engine.KindAttention)
}

// context returns probs·vh as [B, Hkv, N, G, Dh] (batch over B and the kv head, contract M).
func context(probs, vh *graph.Node) *graph.Node {
	return engine.DotGeneral(probs, []int{4}, []int{0, 1}, vh, []int{2}, []int{0, 1})
}

// merge turns the [B, Hkv, N, G, Dh] context into [B, N, H*Dh].
func (l layout) merge(ctx *graph.Node) *graph.Node {
	return graph.Reshape(graph.TransposeAllDims(ctx, 0, 2, 1, 3, 4), l.b, l.n, l.d)
}

// maskScores soft-caps s, a [B, Hkv, N, G, M] score tensor, when the mask says so (Mask.SoftCap) and adds the
// mask (rebuilt from its inputs).
func maskScores(s *graph.Node, mask Mask, n, m int) *graph.Node {
	s = softCap(s, mask.SoftCap)
	add := mask.additive(s.Graph(), s.DType(), n, m)
	if add == nil {
		return s
	}
	// [B|1, 1, N|1, M] -> [B|1, 1, N|1, 1, M]
	return engine.SetKind(graph.Add(s, graph.InsertAxes(add, 3)), engine.KindAttention)
}

// softCap returns cap * tanh(s / cap), or s when cap is not positive. Its gradient is GoMLX's: d/ds = 1 - tanh²,
// from the kept tanh (MemoryEfficient recomputes the scores instead and takes the cap's derivative itself).
func softCap(s *graph.Node, cap float64) *graph.Node {
	if cap <= 0 {
		return s
	}
	return graph.MulScalar(graph.Tanh(graph.MulScalar(s, 1/cap)), cap)
}

// Standard is multi-head scaled dot-product attention that keeps the probabilities for the backward pass.
//
// q is [B, N, H*Dh]; k and v are [B, M, Hkv*Dh] with H a multiple of Hkv (grouped-query attention when
// Hkv < H, query head h reading kv head h / (H/Hkv); pass Hkv = H for plain multi-head attention). The result is
// [B, N, H*Dh].
//
// Kept for the backward pass: the scaled q and k (score product), the probabilities (softmax and value product,
// one tensor) and v, head-major (each the size of its projection).
func Standard(q, k, v *graph.Node, heads, kvHeads int, mask Mask) *graph.Node {
	l := newLayout(q, k, v, heads, kvHeads)
	qh, kh, vh := l.split(q, k, v)
	qh, kh, vh = mask.keep("attn", qh, 1), mask.keep("attn", kh, 1), mask.keep("attn", vh, 1)
	probs := mask.keep("softmax", Softmax(maskScores(scores(qh, kh), mask, l.n, l.m)), 1)
	return l.merge(engine.SetKind(context(probs, vh), engine.KindAttention))
}

// MemoryEfficient computes the same attention as Standard but does not keep the probabilities: its backward
// keeps q, k, v and one log-sum-exp per query row and recomputes the probabilities, as FlashAttention does.
// (The whole score matrix still exists transiently, once in the forward and once in the backward pass; it is
// not tiled.)
//
// Backward. With S the masked scaled scores, lse = log sum_j exp(S_j) per row, P = exp(S - lse), O = P V and
// g = dL/dO:
//
//	dV = Pᵀ g,   dP = g Vᵀ,   dS = P ∘ (dP - D),   D = rowsum(P ∘ dP)   (= rowsum(g ∘ O), since O = P V)
//
// and dS flows on to q and k through the score product's own matmul gradient (dq = dS k, dk = dSᵀ q). With a
// soft-cap S = c tanh(R / c) + mask of the raw scores R, so dR = dS (1 - (tanh(R / c))²), from the recomputed S. Here the
// VJP of the value product recomputes S from q and k and the mask from its inputs, P from S and lse, and returns
// dS to the probabilities, whose softmax nodes pass it straight to S. D is taken from P and dP, so the output O
// is not kept either. Where the backend has a fused softmax (the pure-Go one) P is recomputed with it from S
// alone, and lse is not kept.
func MemoryEfficient(q, k, v *graph.Node, heads, kvHeads int, mask Mask) *graph.Node {
	l := newLayout(q, k, v, heads, kvHeads)
	qh, kh, vh := l.split(q, k, v)
	qh, kh, vh = mask.keep("attn", qh, 1), mask.keep("attn", kh, 1), mask.keep("attn", vh, 1)
	// A soft-cap's gradient is taken below from the recomputed scores: its nodes pass the gradient straight on.
	capped, uncapped := scores(qh, kh), mask
	if c := mask.SoftCap; c > 0 {
		a := engine.PassThrough(graph.MulScalar(capped, 1/c), engine.KindAttention, 0)
		t := engine.PassThrough(graph.Tanh(a), engine.KindAttention, 0)
		capped = engine.PassThrough(graph.MulScalar(t, c), engine.KindAttention, 0)
		uncapped.SoftCap = 0
	}
	s := maskScores(capped, uncapped, l.n, l.m)
	var probs *graph.Node
	var recompute func(s *graph.Node) *graph.Node // the probabilities again, from recomputed scores
	if engine.Fused(s, compute.OpTypeFusedSoftmax) {
		// The backend's fused softmax (one pass with a fast float32 exp) in both passes; no log-sum-exp is kept.
		probs = engine.PassThrough(graph.BackendFusedSoftmax(s, s.Rank()-1), engine.KindAttention, 0)
		recompute = func(s *graph.Node) *graph.Node { return graph.BackendFusedSoftmax(s, s.Rank()-1) }
	} else {
		mx := graph.StopGradient(graph.ReduceAndKeep(s, graph.ReduceMax, -1))
		shifted := engine.PassThrough(graph.Sub(s, mx), engine.KindAttention, 0)
		e := engine.PassThrough(graph.Exp(shifted), engine.KindAttention, 0)
		sum := graph.ReduceAndKeep(e, graph.ReduceSum, -1)
		lse := graph.StopGradient(graph.Add(mx, graph.Log(sum)))
		probs = engine.PassThrough(graph.Div(e, sum), engine.KindAttention, 0)
		recompute = func(s *graph.Node) *graph.Node { return graph.Exp(graph.Sub(s, lse)) }
	}
	ctx := context(probs, vh)
	engine.SetVJP(ctx, engine.KindAttention, func(ctx, g *graph.Node) []*graph.Node {
		// Behind barriers (engine.Recompute), so no backend merges the recomputed scores and probabilities with
		// the forward ones (keeping those alive instead); int8 copies under Mesa.
		qk := engine.Recompute(qh, kh)
		vh := engine.Fresh(vh)
		y := softCap(scores(qk[0], qk[1]), mask.SoftCap)
		p := recompute(maskScores(y, uncapped.recomputed(), l.n, l.m))
		dv := engine.Product(p, []int{2, 3}, []int{0, 1}, g, []int{2, 3}, []int{0, 1}) // [B, Hkv, M, Dh]
		dp := engine.Product(g, []int{4}, []int{0, 1}, vh, []int{3}, []int{0, 1})      // [B, Hkv, N, G, M]
		d := graph.ReduceAndKeep(graph.Mul(p, dp), graph.ReduceSum, -1)
		ds := graph.Mul(p, graph.Sub(dp, d))
		if c := mask.SoftCap; c > 0 {
			// y = c tanh(s / c): dy/ds = 1 - tanh²(s / c) = 1 - (y / c)², from the recomputed y.
			ds = graph.Mul(ds, graph.OneMinus(graph.Square(graph.MulScalar(y, 1/c))))
		}
		return engine.OperandGrads(ctx, ds, dv)
	})
	return l.merge(ctx)
}

// Cached attends from the new tokens' queries q [B, N, H*Dh] to a key/value cache kept head-major in the layouts
// the backend's matmuls take without copying: keysT [B, Hkv, Dh, M] (the keys transposed: the score product
// contracts Dh, on the right operand's first non-batch axis) and values [B, Hkv, M, Dh]. The same attention as
// Standard on k, v = the cache's keys and values (a decoding step has no backward pass); only q is rearranged,
// so a step does not copy the cache.
func Cached(q, keysT, values *graph.Node, heads, kvHeads int, mask Mask) *graph.Node {
	if q.Rank() != 3 || keysT.Rank() != 4 || values.Rank() != 4 {
		panic(fmt.Sprintf("attention: cached attention needs q [B, N, H*Dh], keys [B, Hkv, Dh, M], values [B, Hkv, M, Dh], got %s, %s, %s",
			q.Shape(), keysT.Shape(), values.Shape()))
	}
	l := layout{b: q.Shape().Dim(0), n: q.Shape().Dim(1), d: q.Shape().Dim(2), m: values.Shape().Dim(2), heads: heads, kvHeads: kvHeads}
	if heads <= 0 || kvHeads <= 0 || heads%kvHeads != 0 || l.d%heads != 0 {
		panic(fmt.Sprintf("attention: %d heads and %d kv heads do not fit hidden size %d", heads, kvHeads, l.d))
	}
	l.dh, l.group = l.d/heads, heads/kvHeads
	for _, s := range [][2][]int{{keysT.Shape().Dimensions, {l.b, kvHeads, l.dh, l.m}}, {values.Shape().Dimensions, {l.b, kvHeads, l.m, l.dh}}} {
		if fmt.Sprint(s[0]) != fmt.Sprint(s[1]) {
			panic(fmt.Sprintf("attention: cache tensor %v, want %v", s[0], s[1]))
		}
	}
	q5 := graph.MulScalar(graph.Reshape(q, l.b, l.n, l.kvHeads, l.group, l.dh), 1/math.Sqrt(float64(l.dh)))
	qh := graph.TransposeAllDims(q5, 0, 2, 1, 3, 4) // [B, Hkv, N, G, Dh]
	// Both products below are the backend's non-transposed kind with N*G rows per (sequence, kv head). The
	// pure-Go backend's small kernel for that layout (compute v0.1.14) runs rows four at a time and any rest with
	// a scalar loop down the cache's columns: a decode step's N*G (1 x 2 for llama-tiny) is all rest. Zero query
	// rows padded onto G make it a multiple of four (their scores and contexts are dropped again below): runner's
	// BenchmarkDecode went from 1.7k to 2.0k tokens/s at one row, 4.4k to 5.7k at eight (2-core VM).
	group := l.group
	if pad := cachedRowPad(q, l.n, l.group); pad > 0 {
		zeros := graph.Zeros(q.Graph(), shapes.Make(qh.DType(), l.b, l.kvHeads, l.n, pad, l.dh))
		qh = graph.Concatenate([]*graph.Node{qh, zeros}, 3)
		group += pad
	}
	s := engine.DotGeneral(qh, []int{4}, []int{0, 1}, keysT, []int{2}, []int{0, 1}) // [B, Hkv, N, G, M]
	probs := Softmax(maskScores(s, mask, l.n, l.m))
	ctx := context(probs, values)
	if group != l.group {
		ctx = engine.SliceAxis(ctx, 3, 0, l.group)
	}
	return l.merge(ctx)
}

// cachedRowPad returns how many zero query rows per group make N*G a multiple of four for Cached's products on
// the pure-Go backend, or 0 (other backends, or a multiple already).
func cachedRowPad(q *graph.Node, n, g int) int {
	if q.Graph().Backend().String() != "go" {
		return 0
	}
	for pad := 0; pad < 4; pad++ {
		if n*(g+pad)%4 == 0 {
			return pad
		}
	}
	return 0
}
