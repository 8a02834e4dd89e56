package engine

import (
	"github.com/gomlx/gomlx/core/graph"
)

// Checkpoint applies build to inputs without keeping its internal activations for the backward pass: the
// backward recomputes build from the inputs and differentiates the recomputation (gradient checkpointing). Only
// the inputs are kept. build must be a pure function of its inputs (the same graph each call).
//
// How. The forward runs build on StopGradient(inputs), so no gradient flows through its nodes. The result is
// tied to each input by a zero scalar, tie = sum_i 0 * sum(input_i), added to the output: the output's VJP
// stores v = dL/dy, and the VJP of each sum(input_i) returns dL/d input_i, taken from one recomputation
//
//	y' = build(inputs),   (dL/d input_1, ..., dL/d input_n) = d/d inputs of sum(y' * StopGradient(v))
//
// which is a vector-Jacobian product because v is constant to the inner differentiation. The recomputation and
// its gradient are built once, when the first input's VJP runs. (An input holding an infinity makes the forward
// NaN through the 0 * inf of the tie; such a step is broken anyway and the NaN check stops training.)
func Checkpoint(build func(inputs []*graph.Node) *graph.Node, inputs ...*graph.Node) *graph.Node {
	stopped := make([]*graph.Node, len(inputs))
	for i, in := range inputs {
		stopped[i] = graph.StopGradient(in)
	}
	y := build(stopped)
	g := y.Graph()

	var v *graph.Node       // dL/dy, captured by the output's VJP
	var grads []*graph.Node // the recomputed input gradients
	compute := func() {
		if grads != nil {
			return
		}
		yr := build(inputs)
		target := graph.ReduceAllSum(graph.Mul(yr, graph.StopGradient(v)))
		var floats []*graph.Node
		for _, in := range inputs {
			if in.DType().IsFloat() {
				floats = append(floats, in)
			}
		}
		fg := graph.Gradient(target, floats...)
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
