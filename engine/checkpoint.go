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
// The recomputation reads the inputs through one optimization barrier that also holds v (behind a
// StopGradient), so that no backend merges it back into the forward pass and none can run it before the
// backward pass reaches the block: XLA's scheduler would otherwise run every block's recomputation during the
// forward pass and hold the results (on an H200 the llama-1b grad-ckpt step compiled to plain's peak + 1.0 GiB;
// order.go). Float graph parameters (weights) stay out of the barrier on the pure-Go backend, whose barrier would
// copy a parameter, and what is computed from weights alone is small there; on other backends they go through it.
// (GoMLX's StopGradient, which an earlier version put on every input, is an Identity that the pure-Go backend
// also copies: the block's weights were copied every step.) With ties off (TiesEnv) the barrier holds the inputs
// alone, as up to issue 35.
func Checkpoint(build func(inputs []*graph.Node) *graph.Node, inputs ...*graph.Node) *graph.Node {
	if len(inputs) == 0 {
		panic("engine.Checkpoint: no inputs")
	}
	g := inputs[0].Graph()
	ties := Ties()
	resume := suspendPins(g) // nothing of the forward build is kept: no residual to pin (Pin)
	y := build(inputs)
	resume()

	var v *graph.Node       // dL/dy, captured by the output's VJP
	var grads []*graph.Node // the recomputed input gradients
	compute := func() {
		if grads != nil {
			return
		}
		recompute := slices.Clone(inputs)
		// On XLA the float parameters go through the barrier too (a barrier on a parameter costs nothing there),
		// so that nothing of the recomputation, weight-only parts included, can start early; on the pure-Go
		// backend a barrier would copy them every step.
		weightsToo := ties && g.Backend().String() != "go"
		var barred []int
		for i, in := range inputs {
			if in.Type() != graph.NodeTypeParameter || !in.DType().IsFloat() || weightsToo {
				barred = append(barred, i)
			}
		}
		var target *graph.Node
		if ties {
			// One barrier of its own over the inputs and the block output's gradient v: the recomputation
			// cannot start before the backward pass reaches the block (order.go). Not Recompute's cached
			// barrier: integer inputs (masks, positions) are shared by every block. v goes in behind a
			// StopGradient, so that the differentiation below, which passes the barrier's output gradients
			// to its operands, sends nothing back into the backward graph v is computed by.
			bs := barriers(append(pick(inputs, barred), graph.StopGradient(v))...)
			for j, i := range barred {
				recompute[i] = bs[j]
			}
			yr := build(recompute)
			target = graph.ReduceAllSum(graph.Mul(yr, bs[len(barred)]))
		} else {
			fresh := Recompute(pick(inputs, barred)...)
			for j, i := range barred {
				recompute[i] = fresh[j]
			}
			yr := build(recompute)
			target = graph.ReduceAllSum(graph.Mul(yr, graph.StopGradient(v)))
		}
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
