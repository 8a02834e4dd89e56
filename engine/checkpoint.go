package engine

import (
	"slices"

	"github.com/gomlx/gomlx/core/graph"
)

// pick returns xs[i] for each i in at.
func pick(xs []*graph.Node, at []int) []*graph.Node {
	out := make([]*graph.Node, len(at))
	for j, i := range at {
		out[j] = xs[i]
	}
	return out
}

// Checkpoint applies build to inputs without keeping its internal activations for the backward pass: the
// backward recomputes build from the inputs and differentiates the recomputation (gradient checkpointing). Only
// the inputs are kept. build must be a pure function of its inputs (the same graph each call).
//
// How. The forward runs build on the inputs; the output's VJP passes no gradient to build's result, so none
// flows through its nodes. The result is tied to each input by a zero scalar, tie = sum_i 0 * sum(input_i),
// added to the output: the output's VJP stores v = dL/dy, and the VJP of each sum(input_i) returns
// dL/d input_i, taken from one recomputation
//
//	y' = build(inputs),   (dL/d input_1, ..., dL/d input_n) = d/d inputs of sum(y' * StopGradient(v))
//
// which is a vector-Jacobian product because v is constant to the inner differentiation. The recomputation and
// its gradient are built once, when the first input's VJP runs. (An input holding an infinity makes the forward
// NaN through the 0 * inf of the tie; such a step is broken anyway and the NaN check stops training.)
//
// The recomputation reads the inputs through engine.Recompute (an optimization barrier), so that no backend
// merges it back into the forward pass, except float graph parameters (weights): the pure-Go backend's barrier
// would copy a parameter, and what is computed from weights alone is small. (GoMLX's StopGradient, which an
// earlier version put on every input, is an Identity that the pure-Go backend also copies: the block's weights
// were copied every step.)
func Checkpoint(build func(inputs []*graph.Node) *graph.Node, inputs ...*graph.Node) *graph.Node {
	y := build(inputs)
	g := y.Graph()

	var v *graph.Node       // dL/dy, captured by the output's VJP
	var grads []*graph.Node // the recomputed input gradients
	compute := func() {
		if grads != nil {
			return
		}
		recompute := slices.Clone(inputs)
		var barred []int
		for i, in := range inputs {
			if in.Type() != graph.NodeTypeParameter || !in.DType().IsFloat() {
				barred = append(barred, i)
			}
		}
		fresh := Recompute(pick(inputs, barred)...)
		for j, i := range barred {
			recompute[i] = fresh[j]
		}
		yr := build(recompute)
		target := graph.ReduceAllSum(graph.Mul(yr, graph.StopGradient(v)))
		var floats []*graph.Node
		for _, in := range inputs {
			if in.DType().IsFloat() {
				floats = append(floats, in)
			}
		}
		fg := gradient(target, floats)
		grads = make([]*graph.Node, len(inputs))
		for i, in := range inputs {
			if in.DType().IsFloat() {
				grads[i], fg = fg[0], fg[1:]
			}
		}
	}

	var tie *graph.Node
	for i, in := range inputs {
		if !in.DType().IsFloat() {
			continue // integer inputs (ids, masks) take no gradient
		}
		idx := i
		sum := SetVJP(graph.ReduceAllSum(in), KindOther, func(node, _ *graph.Node) []*graph.Node {
			compute()
			return []*graph.Node{grads[idx]}
		})
		zero := PassThrough(graph.MulScalar(sum, 0), KindOther, 0)
		if zero.DType() != y.DType() {
			zero = graph.ConvertDType(zero, y.DType())
		}
		if tie == nil {
			tie = zero
		} else {
			tie = graph.Add(tie, zero)
		}
	}
	if tie == nil {
		return y
	}
	out := graph.Add(y, tie)
	return SetVJP(out, KindOther, func(node, dy *graph.Node) []*graph.Node {
		v = dy
		return []*graph.Node{nil, graph.ScalarZero(g, tie.DType())}
	})
}
