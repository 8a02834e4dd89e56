package engine

import (
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
)

// RNG threads a random-number generator state through a graph: each draw consumes the state and produces the
// next one, so a training step takes the state as an input and returns State() as an output, and a run that
// saves it resumes with exactly the same random numbers.
type RNG struct{ state *graph.Node }

// NewRNG starts from state, a graph node of shape graph.RNGStateShape.
func NewRNG(state *graph.Node) *RNG { return &RNG{state: state} }

// Uniform returns values uniform in [0, 1) of the given shape (float dtype).
func (r *RNG) Uniform(shape shapes.Shape) *graph.Node {
	var values *graph.Node
	r.state, values = graph.RandomUniform(r.state, shape)
	return values
}

// State returns the state after every draw made so far.
func (r *RNG) State() *graph.Node { return r.state }

// Dropout zeroes each element of x with probability p and scales the others by 1/(1-p) (inverted dropout, as
// torch.nn.Dropout in training mode). p = 0 returns x unchanged.
//
// Backward: Where's gradient routes v through the kept elements, reading only the boolean mask (one byte per
// element), and the scaling multiplies by a constant.
func Dropout(r *RNG, x *graph.Node, p float64) *graph.Node {
	if p <= 0 {
		return x
	}
	keep := graph.GreaterOrEqual(r.Uniform(x.Shape()), graph.Scalar(x.Graph(), x.DType(), p))
	scaled := graph.MulScalar(x, 1/(1-p))
	return graph.Where(keep, scaled, graph.ZerosLike(scaled))
}

// RNGStateDType is the dtype of RNG states (uint64).
var RNGStateDType = dtypes.Uint64
