package engine

import (
	"fmt"
	"slices"

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
	out := graph.DotGeneral(lhs, slices.Clone(lc), slices.Clone(lb), rhs, slices.Clone(rc), slices.Clone(rb))
	return SetVJP(out, KindOther, func(node, v *graph.Node) []*graph.Node {
		// Fresh: an operand marked Recomputable (a dequantised weight) is rebuilt here rather than kept.
		a, c := Fresh(node.Inputs()[0]), Fresh(node.Inputs()[1])
		return []*graph.Node{
			dotGeneralOperandGrad(v, a.Rank(), lc, lb, c, rc, rb, false),
			dotGeneralOperandGrad(v, c.Rank(), rc, rb, a, lc, lb, true),
		}
	})
}

// dotGeneralOperandGrad returns the gradient for one operand ("self", of rank selfRank with contracting axes sc
// and batch axes sb) of a DotGeneral whose other operand is other (contracting oc, batch ob). isRHS says whether
// self was the right-hand operand, which decides where its free axes sit in v.
func dotGeneralOperandGrad(v *graph.Node, selfRank int, sc, sb []int, other *graph.Node, oc, ob []int, isRHS bool) *graph.Node {
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
	g := graph.DotGeneral(v, vOtherFree, vBatch, other, slices.Clone(otherFree), slices.Clone(ob))
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
	if isIdentity(perm) {
		return g
	}
	return graph.TransposeAllDims(g, perm...)
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
	y := SetKind(DotGeneral(x, []int{x.Rank() - 1}, nil, w, []int{1}, nil), KindLinear)
	if b == nil {
		return y
	}
	if b.Rank() != 1 || b.Shape().Dim(0) != w.Shape().Dim(0) {
		panic(fmt.Sprintf("engine.Linear: bias must be [%d], got %s", w.Shape().Dim(0), b.Shape()))
	}
	return SetKind(graph.Add(y, graph.ExpandLeftToRank(b, y.Rank())), KindLinear)
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
