package engine

import (
	"fmt"

	"github.com/gomlx/gomlx/core/graph"
)

// Slice returns x[starts[0]:limits[0], starts[1]:limits[1], ...] (unit strides). Axes beyond len(starts) are
// taken whole. Negative indices count from the end of the axis.
//
// Backward: the gradient of a slice is v placed back at its offset inside zeros of x's shape. GoMLX builds that
// with Pad, which the pure-Go backend lacks; here each sliced axis is padded by concatenating zero blocks before
// and after v, which every backend supports. It reads no forward tensor.
func Slice(x *graph.Node, starts, limits []int) *graph.Node {
	if len(starts) != len(limits) || len(starts) > x.Rank() {
		panic(fmt.Sprintf("engine.Slice: %d starts and %d limits for rank-%d input", len(starts), len(limits), x.Rank()))
	}
	dims := x.Shape().Dimensions
	lo := make([]int, x.Rank())
	hi := make([]int, x.Rank())
	for axis := range dims {
		lo[axis], hi[axis] = 0, dims[axis]
		if axis < len(starts) {
			lo[axis], hi[axis] = starts[axis], limits[axis]
			if lo[axis] < 0 {
				lo[axis] += dims[axis]
			}
			if hi[axis] < 0 {
				hi[axis] += dims[axis]
			}
			if lo[axis] < 0 || hi[axis] > dims[axis] || lo[axis] > hi[axis] {
				panic(fmt.Sprintf("engine.Slice: range [%d:%d] out of bounds for axis %d of %s", starts[axis], limits[axis], axis, x.Shape()))
			}
		}
	}
	specs := make([]graph.SliceAxisSpec, x.Rank())
	for axis := range specs {
		specs[axis] = graph.AxisRange(lo[axis], hi[axis])
	}
	out := graph.Slice(x, specs...)
	return SetVJP(out, KindOther, func(node, v *graph.Node) []*graph.Node {
		return []*graph.Node{padWithZeros(v, lo, hi, dims)}
	})
}

// SliceAxis slices one axis of x to [start:limit] and keeps the others whole.
func SliceAxis(x *graph.Node, axis, start, limit int) *graph.Node {
	if axis < 0 {
		axis += x.Rank()
	}
	starts := make([]int, axis+1)
	limits := make([]int, axis+1)
	for a := 0; a < axis; a++ {
		limits[a] = x.Shape().Dim(a)
	}
	starts[axis], limits[axis] = start, limit
	return Slice(x, starts, limits)
}

// padWithZeros embeds v at [lo, hi) along each axis of a zero tensor with dimensions dims.
func padWithZeros(v *graph.Node, lo, hi, dims []int) *graph.Node {
	g := v.Graph()
	for axis := range dims {
		if lo[axis] == 0 && hi[axis] == dims[axis] {
			continue
		}
		parts := make([]*graph.Node, 0, 3)
		cur := v.Shape().Clone()
		if lo[axis] > 0 {
			zs := cur.Clone()
			zs.Dimensions[axis] = lo[axis]
			parts = append(parts, graph.Zeros(g, zs))
		}
		parts = append(parts, v)
		if hi[axis] < dims[axis] {
			zs := cur.Clone()
			zs.Dimensions[axis] = dims[axis] - hi[axis]
			parts = append(parts, graph.Zeros(g, zs))
		}
		v = graph.Concatenate(parts, axis)
	}
	return v
}
