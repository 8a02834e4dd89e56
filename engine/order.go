package engine

import (
	"os"
	"strings"

	"github.com/gomlx/gomlx/core/graph"
)

// TiesEnv is the environment variable that turns the ordering ties off when set to 0 or false (the default is on):
// the A/B switch of bench/gpu/verify.sh's memory-mode stage.
const TiesEnv = "MEMFIT_XLA_TIES"

// Ties reports whether engine builds the data dependences that order recomputations and compressed residuals
// (Recompute's tie to the cotangent, Checkpoint's tied barrier, Pin): on unless TiesEnv is 0 or false. It is
// read when a graph is built.
func Ties() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(TiesEnv))) {
	case "0", "false", "off", "no":
		return false
	}
	return true
}

// Pin returns y and the residuals (forward tensors computed from y's input or y itself, kept for the backward
// pass instead of a float tensor: 2-bit activation codes, Mesa's int8 codes and their scales) behind one
// optimization barrier: the forward pass must continue from the returned y (every forward reader of y reads it
// through the barrier) and the backward function must read the returned residuals. The residuals then have to
// be computed before anything downstream of y runs, so no backend can compute them late (or fuse them into the
// backward's reader) and keep their float input alive until then.
//
// The barrier passes y's gradient straight through, and none to the residuals (Gradient gives a barrier's inputs
// the gradients of its outputs, nil where none arrived). Where ties are off (TiesEnv), and in the forward pass of
// a Checkpoint block (whose internal tensors are not kept, so nothing needs pinning), Pin returns its arguments
// unchanged. On the pure-Go backend the barrier moves its operands (they have no other reader) and copies nothing.
func Pin(y *graph.Node, residuals ...*graph.Node) (*graph.Node, []*graph.Node) {
	if y == nil {
		panic("engine.Pin: nil node")
	}
	g := y.Graph()
	g.AssertBuilding()
	if len(residuals) == 0 || !Ties() || pinsSuspended(g) {
		return y, residuals
	}
	out := barriers(append([]*graph.Node{y}, residuals...)...)
	return out[0], out[1:]
}

// barriers returns graph.OptimizationBarriers(operands...) (at least two), marked as engine's own: Gradient
// passes each output's gradient to its operand and none where none arrived (see gradient).
func barriers(operands ...*graph.Node) []*graph.Node {
	if len(operands) < 2 {
		panic("engine: a barrier needs at least two operands (go-xla drops single-operand ones on XLA's CPU compiler)")
	}
	out := graph.OptimizationBarriers(operands...)
	modify(out[0].Inputs()[0], func(e *entry) { e.ownBarrier = true })
	return out
}

// isOwnBarrier reports whether node is a multi-output barrier built by barriers.
func isOwnBarrier(node *graph.Node) bool {
	e := lookup(node)
	return e != nil && e.ownBarrier
}

// tieOf returns the cotangent Recompute ties its barrier to in g: the gradient arriving at the node whose
// backward function is running, or nil outside one (or with ties off).
func tieOf(g *graph.Graph) *graph.Node {
	if !Ties() {
		return nil
	}
	r := recordFor(g, false)
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cotangent
}

// setCotangent records v as the cotangent of the backward function about to run in g, and returns the previous
// one (Gradient restores it afterwards: Checkpoint differentiates its block inside a backward function).
func setCotangent(g *graph.Graph, v *graph.Node) (prev *graph.Node) {
	r := recordFor(g, true)
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, r.cotangent = r.cotangent, v
	return prev
}

// suspendPins turns Pin off in g until the returned function is called (Checkpoint's forward build).
func suspendPins(g *graph.Graph) (resume func()) {
	r := recordFor(g, true)
	r.mu.Lock()
	r.unpinned++
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		r.unpinned--
		r.mu.Unlock()
	}
}

func pinsSuspended(g *graph.Graph) bool {
	r := recordFor(g, false)
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unpinned > 0
}
