package engine

import (
	"fmt"
	"slices"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
)

// DotGeneral is graph.DotGeneral with a matmul-based gradient, tagged KindOther (use SetKind, Linear or the
// attention builders for a more specific kind).
//
// The output axes are [batch axes (in lhsBatch order), lhs free axes, rhs free axes], as in graph.DotGeneral.
//
// Backward. Write y[b,i,j] = sum_k a[b,i,k] * c[b,j,k], with b the batch axes, i the free axes of a, j the free
// axes of c and k the contracting pairs. With v = dL/dy:
//
//	dL/da[b,i,k] = sum_j v[b,i,j] * c[b,j,k]   -> DotGeneral(v, contract j, batch b; c, contract its free axes, batch b)
//	dL/dc[b,j,k] = sum_i v[b,i,j] * a[b,i,k]   -> DotGeneral(v, contract i, batch b; a, contract its free axes, batch b)
//
// Each result comes out as [b, free of v, remaining axes of the other operand in their own order] and is
// transposed back to the operand's axis order when that differs. Two matmuls, never the [M,N,K] broadcast that
// GoMLX's own DotGeneral gradient builds. The backward reads a and c (the forward inputs) and nothing else.
func DotGeneral(lhs *graph.Node, lhsContracting, lhsBatch []int, rhs *graph.Node, rhsContracting, rhsBatch []int) *graph.Node {
	lc := normAxes(lhs.Rank(), lhsContracting)
	lb := normAxes(lhs.Rank(), lhsBatch)
	rc := normAxes(rhs.Rank(), rhsContracting)
	rb := normAxes(rhs.Rank(), rhsBatch)
	// The operands may reach the backend transposed (see product): the backward below reads the
	// original operands and returns the gradients of the transposed ones directly in their axis order (one
	// transpose each, folded into the one the gradient needs anyway).
	out, lperm, rperm := product(lhs, lc, lb, rhs, rc, rb, false)
	if lperm != nil || rperm != nil {
		setOperandPerms(out, lperm, rperm)
	}
	return SetVJP(out, KindOther, func(node, v *graph.Node) []*graph.Node {
		// Fresh: an operand marked Recomputable (a dequantised weight) is rebuilt here rather than kept.
		a, c := Fresh(lhs), Fresh(rhs)
		return []*graph.Node{
			dotGeneralOperandGrad(v, a.Rank(), lc, lb, c, rc, rb, false, lperm),
			dotGeneralOperandGrad(v, c.Rank(), rc, rb, a, lc, lb, true, rperm),
		}
	})
}

// product is graph.DotGeneral(lhs, lc, lb, rhs, rc, rb) as the pure-Go backend runs it best; on other backends
// it is exactly that call.
//
// The Go backend's matmul kernels take [batch, cross, contracting] on the left and [batch, contracting, cross]
// or [batch, cross, contracting] on the right; GoMLX (v0.28.2 to v0.28.16) transposes operands in other orders into
// the second form, both of them when needed (a weight gradient vᵀx, contracting the token axis of both, transposes v and
// x). product instead transposes as few bytes as it can: it picks the right operand's form that needs no copy,
// and when swapped is true it may also swap the operands (computing rhs·lhs and transposing the output back,
// worth it when the output is small, as weight gradients are). Measured on the scaled ViT's full fine-tuning step
// (GoMLX v0.28.2): the backend's Transposes took 0.42 s of a 2.3 s step before. (v0.28.2's small transposed
// kernel was 18x slower than the non-transposed one in SIMD builds, so small products were handed over
// non-transposed even at the price of a copy; compute v0.1.14's run at the same speed.)
//
// lperm and rperm are the transposes applied to lhs and rhs (nil for none), for VJPs that must return the
// gradients of the node's actual inputs; products built with swapped never carry a VJP.
func product(lhs *graph.Node, lc, lb []int, rhs *graph.Node, rc, rb []int, swapped bool) (out *graph.Node, lperm, rperm []int) {
	if lhs.Graph().Backend().String() != "go" {
		return graph.DotGeneral(lhs, slices.Clone(lc), slices.Clone(lb), rhs, slices.Clone(rc), slices.Clone(rb)), nil, nil
	}
	// Bytes copied by transposes for each way of running the product.
	bytes := func(x *graph.Node) int { return x.Shape().Size() * x.DType().Size() }
	formCost := func(x *graph.Node, batch, contract []int, contractFirst bool) int {
		if _, _, inOrder := canonicalOrder(x.Rank(), batch, contract, contractFirst); inOrder {
			return 0
		}
		return bytes(x)
	}
	// rhsCost returns the cheaper allowed form for the right operand: contractFirst true is the non-transposed
	// [batch, contracting, cross] form.
	rhsCost := func(x *graph.Node, batch, contract []int) (int, bool) {
		nt := formCost(x, batch, contract, true)
		if t := formCost(x, batch, contract, false); t < nt {
			return t, false
		}
		return nt, true
	}
	straightR, straightNT := rhsCost(rhs, rb, rc)
	straight := formCost(lhs, lb, lc, false) + straightR
	if swapped {
		swapR, swapNT := rhsCost(lhs, lb, lc)
		nb, nfl := len(lb), lhs.Rank()-len(lb)-len(lc)
		nfr := rhs.Rank() - len(rb) - len(rc)
		outElems := lhs.Shape().Size() / max(1, sizeOf(lhs, lc)) * (rhs.Shape().Size() / max(1, sizeOf(rhs, rb)*sizeOf(rhs, rc)))
		outBytes := outElems * lhs.DType().Size()
		// A tie (up to the small output's transpose) goes to the swap, which copies the right operand: in the
		// weight gradients vᵀx built below, that is the layer's input x, which several layers often share (q, k
		// and v read one norm output; gate and up too), and the backend de-duplicates identical transposes, so
		// they share one copy. On the scaled ViT's full fine-tuning step this took its weight-gradient transposes
		// from 24 to 16.
		swapCopies := formCost(rhs, rb, rc, false) + swapR
		if swapCopies < straight || (swapCopies == straight && outBytes*8 <= straight) {
			l, lcc, lbb, _ := permuteOperand(rhs, rb, rc, false)
			r, rcc, rbb, _ := permuteOperand(lhs, lb, lc, swapNT)
			flipped := graph.DotGeneral(l, lcc, lbb, r, rcc, rbb) // [batch, rhs cross, lhs cross]
			perm := append(append(axisRange(0, nb), axisRange(nb+nfr, nfl)...), axisRange(nb, nfr)...)
			return graph.TransposeAllDims(flipped, perm...), nil, nil
		}
	}
	if straight == 0 {
		return graph.DotGeneral(lhs, slices.Clone(lc), slices.Clone(lb), rhs, slices.Clone(rc), slices.Clone(rb)), nil, nil
	}
	l, lcc, lbb, lperm := permuteOperand(lhs, lb, lc, false)
	r, rcc, rbb, rperm := permuteOperand(rhs, rb, rc, straightNT)
	return graph.DotGeneral(l, lcc, lbb, r, rcc, rbb), lperm, rperm
}

// sizeOf is the product of x's dimensions on axes.
func sizeOf(x *graph.Node, axes []int) int {
	n := 1
	for _, a := range axes {
		n *= x.Shape().Dim(a)
	}
	return n
}

// canonicalOrder returns the axis permutation that puts an operand in [batch..., cross..., contracting...] order
// (contractFirst false) or [batch..., contracting..., cross...] order (contractFirst true), batch and contracting
// axes in the order given and cross axes in their own order; its cross axes; and whether the operand is in that
// order already.
func canonicalOrder(rank int, batch, contract []int, contractFirst bool) (perm, cross []int, inOrder bool) {
	perm = slices.Clone(batch)
	for a := 0; a < rank; a++ {
		if !slices.Contains(batch, a) && !slices.Contains(contract, a) {
			cross = append(cross, a)
		}
	}
	if contractFirst {
		perm = append(append(perm, contract...), cross...)
	} else {
		perm = append(append(perm, cross...), contract...)
	}
	return perm, cross, isIdentity(perm)
}

// permuteOperand transposes x into canonical order (see canonicalOrder) and returns it with its new contracting
// and batch axes, and the permutation (nil when x was in order already).
func permuteOperand(x *graph.Node, batch, contract []int, contractFirst bool) (*graph.Node, []int, []int, []int) {
	perm, cross, inOrder := canonicalOrder(x.Rank(), batch, contract, contractFirst)
	nb, nc := len(batch), len(contract)
	newBatch := axisRange(0, nb)
	newContract := axisRange(nb+len(cross), nc)
	if contractFirst {
		newContract = axisRange(nb, nc)
	}
	if inOrder {
		return x, newContract, newBatch, nil
	}
	return graph.TransposeAllDims(x, perm...), newContract, newBatch, perm
}

// Product is graph.DotGeneral(lhs, lc, lb, rhs, rc, rb) for use inside backward functions: on the pure-Go
// backend it copies as few bytes as it can to reach the matmul kernels (see product), swapping the operands when
// that is cheaper. It carries GoMLX's own gradient, so do not differentiate through it (use DotGeneral in
// forward passes).
func Product(lhs *graph.Node, lc, lb []int, rhs *graph.Node, rc, rb []int) *graph.Node {
	out, _, _ := product(lhs, normAxes(lhs.Rank(), lc), normAxes(lhs.Rank(), lb), rhs, normAxes(rhs.Rank(), rc), normAxes(rhs.Rank(), rb), true)
	return out
}

// dotGeneralOperandGrad returns the gradient for one operand ("self", of rank selfRank with contracting axes sc
// and batch axes sb) of a DotGeneral whose other operand is other (contracting oc, batch ob). isRHS says whether
// self was the right-hand operand, which decides where its free axes sit in v. When selfPerm is not nil the
// product read self transposed by selfPerm (axis j of what it read is axis selfPerm[j] of self), and the gradient
// is returned in that transposed order.
func dotGeneralOperandGrad(v *graph.Node, selfRank int, sc, sb []int, other *graph.Node, oc, ob []int, isRHS bool, selfPerm []int) *graph.Node {
	nb := len(sb)
	selfFree := freeAxes(selfRank, sc, sb)
	otherFree := freeAxes(other.Rank(), oc, ob)
	// Axes of v: [batch..., lhs free..., rhs free...].
	vBatch := axisRange(0, nb)
	var vOtherFree []int
	if isRHS {
		vOtherFree = axisRange(nb, len(otherFree)) // other is lhs: its free axes come first.
	} else {
		vOtherFree = axisRange(nb+len(selfFree), len(otherFree))
	}
	g, _, _ := product(v, vOtherFree, vBatch, other, slices.Clone(otherFree), slices.Clone(ob), true)
	// g axes: [batch..., self free..., other's contracting axes in other's axis order].
	otherContractSorted := slices.Clone(oc)
	slices.Sort(otherContractSorted)
	perm := make([]int, selfRank)
	for axis := 0; axis < selfRank; axis++ {
		if p := slices.Index(sb, axis); p >= 0 {
			perm[axis] = p
		} else if p := slices.Index(selfFree, axis); p >= 0 {
			perm[axis] = nb + p
		} else {
			q := slices.Index(sc, axis)
			r := slices.Index(otherContractSorted, oc[q])
			perm[axis] = nb + len(selfFree) + r
		}
	}
	if selfPerm != nil {
		composed := make([]int, selfRank)
		for j, axis := range selfPerm {
			composed[j] = perm[axis]
		}
		perm = composed
	}
	if isIdentity(perm) {
		return g
	}
	return graph.TransposeAllDims(g, perm...)
}

// TransposedWeight returns the [out, in] weight of a linear layer whose weight is held transposed, wT [in, out]:
// Linear then multiplies by wT directly (x·wT, the pure-Go backend's non-transposed product, no copy), and any
// other reader gets the transpose. Decoding holds its weights so (runner.Generator): there a product has one row
// per sequence and would otherwise take either the backend's slow small transposed kernel or a copy of the whole
// weight per step.
func TransposedWeight(wT *graph.Node) *graph.Node {
	if wT.Rank() != 2 {
		panic(fmt.Sprintf("engine.TransposedWeight: weight must be [in, out], got %s", wT.Shape()))
	}
	w := graph.Transpose(wT, 0, 1)
	modify(w, func(e *entry) { e.transposedFrom = wT })
	return w
}

// Linear returns x·wᵀ (+ b), contracting the last axis of x with the second axis of w: x is [..., in], w is
// [out, in] (the Hugging Face layout) and b, if not nil, is [out]. The result is [..., out], tagged KindLinear.
//
// Backward: dx = v·w (contract out), dw = sum over all leading axes of vᵀ x, db = sum of v over the leading
// axes. It keeps x, the very node passed in, so a norm whose output feeds Linear directly shares that tensor.
func Linear(x, w, b *graph.Node) *graph.Node {
	if w.Rank() != 2 {
		panic(fmt.Sprintf("engine.Linear: weight must be [out, in], got %s", w.Shape()))
	}
	if x.Shape().Dim(-1) != w.Shape().Dim(1) {
		panic(fmt.Sprintf("engine.Linear: input %s does not match weight %s ([out, in])", x.Shape(), w.Shape()))
	}
	var y *graph.Node
	if e := lookup(w); e != nil && e.transposedFrom != nil {
		// The weight is held as [in, out] (TransposedWeight): x·wT is the backend's non-transposed product as it
		// stands, with no copy of either operand.
		y = SetKind(heldProduct(x, e.transposedFrom), KindLinear)
	} else if out, in := w.Shape().Dim(0), w.Shape().Dim(1); 4*(x.Shape().Size()/in)*(in+out) < in*out {
		// Few rows (decoding: one token per sequence). The pure-Go backend's matmul takes its right operand
		// [contracting, free] and would transpose all of w to [in, out] in every run, which costs more than the
		// product itself here (measured: llama-tiny's tied head on one token, 2.3 ms against 0.24 ms). With w on
		// the left, where [free, contracting] is its layout already, only the small result [out, rows...] is
		// transposed to [rows..., out]. Same sums; rows*(in+out) well under in*out limits this to such shapes.
		wx := DotGeneral(w, []int{1}, nil, x, []int{x.Rank() - 1}, nil)
		perm := make([]int, wx.Rank())
		for i := range perm {
			perm[i] = (i + 1) % wx.Rank()
		}
		y = SetKind(graph.TransposeAllDims(wx, perm...), KindLinear)
	} else {
		y = SetKind(DotGeneral(x, []int{x.Rank() - 1}, nil, w, []int{1}, nil), KindLinear)
	}
	if b == nil {
		return y
	}
	if b.Rank() != 1 || b.Shape().Dim(0) != w.Shape().Dim(0) {
		panic(fmt.Sprintf("engine.Linear: bias must be [%d], got %s", w.Shape().Dim(0), b.Shape()))
	}
	return SetKind(graph.Add(y, graph.ExpandLeftToRank(b, y.Rank())), KindLinear)
}

// heldProduct returns x·wT for x [..., in] and a weight held as wT [in, out], the pure-Go backend's
// non-transposed product.
//
// Its small non-transposed kernel (compute v0.1.14, dot/matmul/avx512/small_nontransposed.go, the AVX-512 and
// AVX2 paths alike) runs rows four at a time with vector tiles and any remaining rows with a scalar loop that
// reads the weight column by column: a one-row product, which is what each sequence of a decode step is, takes
// that loop for all of it. Measured on the 2-core build VM, [1,128]·[128,4096] (llama-tiny's head) took 1.8 ms
// that way, 0.28 ms with the weight on the left in its [out, in] layout, and 0.05 ms padded with zero rows to
// [4,128] (BenchmarkHeldProduct). So on that backend rows are padded to a multiple of four and the result sliced
// back; other backends get the product as it is.
func heldProduct(x, wT *graph.Node) *graph.Node {
	in := x.Shape().Dim(-1)
	rows := x.Shape().Size() / in
	pad := (4 - rows%4) % 4
	if pad == 0 || x.Graph().Backend().String() != "go" || rows*wT.Shape().Dim(1) >= 4<<20/in {
		// Large products take the packed kernels, which have no such remainder.
		return DotGeneral(x, []int{x.Rank() - 1}, nil, wT, []int{0}, nil)
	}
	g := x.Graph()
	flat := graph.Reshape(x, rows, in)
	padded := graph.Concatenate([]*graph.Node{flat, graph.Zeros(g, shapes.Make(x.DType(), pad, in))}, 0)
	y := SliceAxis(DotGeneral(padded, []int{1}, nil, wT, []int{0}, nil), 0, 0, rows)
	dims := slices.Clone(x.Shape().Dimensions)
	dims[len(dims)-1] = wT.Shape().Dim(1)
	return graph.Reshape(y, dims...)
}

func normAxes(rank int, axes []int) []int {
	out := make([]int, len(axes))
	for i, a := range axes {
		if a < 0 {
			a += rank
		}
		if a < 0 || a >= rank {
			panic(fmt.Sprintf("engine: axis %d out of range for rank %d", axes[i], rank))
		}
		out[i] = a
	}
	return out
}

func freeAxes(rank int, contracting, batch []int) []int {
	var free []int
	for axis := 0; axis < rank; axis++ {
		if !slices.Contains(contracting, axis) && !slices.Contains(batch, axis) {
			free = append(free, axis)
		}
	}
	return free
}

func axisRange(start, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = start + i
	}
	return out
}

func isIdentity(perm []int) bool {
	for i, p := range perm {
		if i != p {
			return false
		}
	}
	return true
}
