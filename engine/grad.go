package engine

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"weak"

	"github.com/gomlx/gomlx/core/graph"
)

// Kind says which family of operation a node belongs to, for memory accounting: the backward nodes a custom VJP
// creates inherit the Kind of the forward node that owns the VJP, so every tensor the backward pass reads can be
// attributed to the op kind that needs it.
type Kind uint8

// The kinds of operations memfit distinguishes when it accounts for saved activations.
const (
	KindOther      Kind = iota // anything not listed below (residual adds, reshapes, losses, ...)
	KindLinear                 // linear layers: the input kept for the weight gradient
	KindNorm                   // LayerNorm / RMSNorm and their memory-sharing variants
	KindActivation             // GELU, SiLU, ReGELU2, ReSiLU2, ...
	KindAttention              // attention score and value products, softmax
	numKinds
)

// Kinds lists every Kind in a stable order, for reports.
var Kinds = []Kind{KindLinear, KindNorm, KindActivation, KindAttention, KindOther}

// String returns the lower-case name of the kind.
func (k Kind) String() string {
	switch k {
	case KindLinear:
		return "linear"
	case KindNorm:
		return "norm"
	case KindActivation:
		return "activation"
	case KindAttention:
		return "attention"
	case KindOther:
		return "other"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// VJP computes the gradients of a node's inputs from v, the gradient of the loss with respect to the node's
// output. It returns one entry per node.Inputs(), in order; a nil entry means no gradient flows to that input.
//
// The function runs inside Gradient, after the whole forward graph is built. Whatever forward node it reads is
// what the backward pass keeps alive, so a memory-saving VJP reads only the tensors it means to keep.
type VJP func(node, v *graph.Node) []*graph.Node

// entry is what the side table knows about one node.
type entry struct {
	vjp  VJP // nil: use GoMLX's own gradient.
	kind Kind
	// remat, when set, rebuilds the node from inputs the backward pass may read freely (parameters,
	// constants): Fresh calls it so a VJP never keeps the forward node alive.
	remat func() *graph.Node
	// operandPerms, for a product built by DotGeneral whose operands reach the backend transposed, holds the
	// transpose of each input (nil: none); see OperandGrads.
	operandPerms [][]int
	// fresh is the node's value behind an optimization barrier, once Recompute has made it (see Recompute);
	// rebuilt is remat's result, once Fresh has built it.
	fresh, rebuilt *graph.Node
	// transposedFrom, for a weight made by TransposedWeight, is the [in, out] node it transposes.
	transposedFrom *graph.Node
	// ownBarrier marks a multi-output optimization barrier built by engine (barriers): its gradient passes
	// nothing to operands whose outputs received none.
	ownBarrier bool
}

// modify registers a copy of node's entry (an empty one if it has none) changed by change.
func modify(node *graph.Node, change func(e *entry)) {
	e := &entry{}
	if old := lookup(node); old != nil {
		*e = *old
	}
	change(e)
	register(node, e)
}

var (
	tableMu sync.RWMutex
	// table maps a node to its entry. Both sides are weak: the entry is owned by a holder node in the node's own
	// graph, so nothing here keeps a graph alive.
	table = map[weak.Pointer[graph.Node]]weak.Pointer[entry]{}
)

// SetVJP makes fn the gradient of node in Gradient (graph.Gradient keeps GoMLX's own), tagged with kind, and
// returns node. Calling it again for the same node replaces the previous function. It panics (like every GoMLX graph builder) if node is nil or its graph is not
// being built.
func SetVJP(node *graph.Node, kind Kind, fn VJP) *graph.Node {
	if node == nil {
		panic("engine.SetVJP: nil node")
	}
	node.Graph().AssertBuilding()
	modify(node, func(e *entry) { e.vjp, e.kind = fn, kind })
	return node
}

// OperandGrads returns the gradients of node's inputs given the gradients of the operands it was built from:
// for a product built by DotGeneral, whose operands may reach the backend transposed (see product), a custom
// VJP set later with SetVJP computes the gradients of the operands it passed to DotGeneral and returns
// OperandGrads(node, dLHS, dRHS). For any other node the gradients are returned as they are.
func OperandGrads(node *graph.Node, grads ...*graph.Node) []*graph.Node {
	e := lookup(node)
	if e == nil || e.operandPerms == nil {
		return grads
	}
	out := make([]*graph.Node, len(grads))
	for i, g := range grads {
		out[i] = g
		if g != nil && i < len(e.operandPerms) && e.operandPerms[i] != nil {
			out[i] = graph.TransposeAllDims(g, e.operandPerms[i]...)
		}
	}
	return out
}

// Recomputable marks node as cheap to rebuild with build and returns node. build must build the same value from
// graph parameters and constants (a weight dequantised from its quantised codes) or from forward tensors the
// backward pass keeps anyway (the factors of a gated product, which the product's own backward reads), reading
// them through Recompute; anything else it reads is kept alive instead of node. Backward functions that read node
// go through Fresh, which builds a new copy at backward time (once per node) instead of keeping node alive from
// the forward pass: QLoRA's dequantised base weight is used this way, so the saved activations never hold a
// full-precision weight, and so is LLaMA's SiLU(gate)*up under approx-act.
func Recomputable(node *graph.Node, build func() *graph.Node) *graph.Node {
	if node == nil || build == nil {
		panic("engine.Recomputable: nil node or build function")
	}
	node.Graph().AssertBuilding()
	modify(node, func(e *entry) { e.remat, e.rebuilt = build, nil })
	return node
}

// Fresh returns what a backward function should read for the forward node: for a node marked Recomputable its
// rebuilt copy (built on the first call), for a node already passed to Recompute its value behind that barrier,
// and otherwise node itself. Call it from backward functions.
func Fresh(node *graph.Node) *graph.Node {
	e := lookup(node)
	switch {
	case e == nil:
		return node
	case e.remat != nil:
		if e.rebuilt == nil {
			rebuilt := e.remat()
			modify(node, func(e *entry) { e.rebuilt = rebuilt })
			return rebuilt
		}
		return e.rebuilt
	case e.fresh != nil:
		return e.fresh
	}
	return node
}

// Recompute returns xs, forward tensors a backward function recomputes something from, behind one optimization
// barrier (graph.OptimizationBarriers) that also holds the cotangent of the backward function calling it (the
// gradient arriving at its node), so that nothing recomputed from them can run before the backward pass reaches
// that node (XLA's scheduler would otherwise be free to run it during the forward pass and hold the result; see
// order.go, and Ties for the switch), and so that no backend can merge the recomputation with the forward
// computation it repeats: GoMLX v0.28's Go backend de-duplicates identical nodes when it builds a graph, and
// XLA's common-subexpression elimination does the same when it compiles one. Without the barrier the backward's
// GELU gate, attention scores and probabilities, QLoRA's dequantised weights and the rebuilt gated product all
// became the forward's own tensors again, kept alive from the forward pass: on the scaled ViT step the backward
// recomputed neither the 4 GELU erfs nor the 4 attention softmaxes.
//
// A node marked Recomputable is returned rebuilt (Fresh), its build reading its own inputs through Recompute.
// Each other x gets its barrier once: later calls, and Fresh, return the same barrier output, so every backward reader
// goes through it and the pure-Go backend, whose barrier copies its input unless that is the input's last use,
// copies nothing (a parameter, never owned by the execution, is still copied: QLoRA's codes). Recompute tags the
// barrier with the kind of the backward function that calls it first.
func Recompute(xs ...*graph.Node) []*graph.Node {
	out := make([]*graph.Node, len(xs))
	var missing []*graph.Node
	var at []int
	for i, x := range xs {
		if e := lookup(x); e != nil && (e.fresh != nil || e.remat != nil) {
			out[i] = Fresh(x) // a Recomputable node's rebuild is built from barriers already
			continue
		}
		missing, at = append(missing, x), append(at, i)
	}
	if len(missing) == 0 {
		return out
	}
	var bs []*graph.Node
	if tie := tieOf(missing[0].Graph()); tie != nil {
		// The cotangent of the backward function running now is one more operand: nothing behind the barrier
		// can be computed before the backward pass reaches that function (order.go). Its own output is not
		// read (on the pure-Go backend it is never executed).
		bs = barriers(append(slices.Clone(missing), tie)...)
	} else {
		bs = graph.OptimizationBarriers(missing...)
	}
	for j, i := range at {
		out[i] = bs[j]
		b := bs[j]
		modify(xs[i], func(e *entry) { e.fresh = b })
	}
	return out
}

// SetKind tags node with kind without changing its gradient, and returns node.
func SetKind(node *graph.Node, kind Kind) *graph.Node {
	if node == nil {
		panic("engine.SetKind: nil node")
	}
	node.Graph().AssertBuilding()
	modify(node, func(e *entry) { e.kind = kind })
	return node
}

// PassThrough makes node's gradient flow unchanged to its input number input (and nowhere else), and returns
// node. It is used inside custom ops whose VJP hands the final input gradient to an intermediate node: for
// example LayerNorm's centring x - mean(x) passes the gradient its custom VJP computed straight to x.
func PassThrough(node *graph.Node, kind Kind, input int) *graph.Node {
	n := len(node.Inputs())
	if input < 0 || input >= n {
		panic(fmt.Sprintf("engine.PassThrough: input %d out of range for node %s with %d inputs", input, node, n))
	}
	return SetVJP(node, kind, func(node, v *graph.Node) []*graph.Node {
		grads := make([]*graph.Node, n)
		grads[input] = v
		return grads
	})
}

// KindOf returns the kind node was tagged with (KindOther when untagged).
func KindOf(node *graph.Node) Kind {
	if e := lookup(node); e != nil {
		return e.kind
	}
	return KindOther
}

// HasCustomVJP reports whether node carries a VJP set with SetVJP.
func HasCustomVJP(node *graph.Node) bool {
	e := lookup(node)
	return e != nil && e.vjp != nil
}

// setOperandPerms records the transposes applied to node's inputs (see OperandGrads).
func setOperandPerms(node *graph.Node, perms ...[]int) {
	modify(node, func(e *entry) { e.operandPerms = perms })
}

// heldEntry is the graph-state key under which a multi-output node's entry is kept (see register).
type heldEntry struct{ node *graph.Node }

func register(node *graph.Node, e *entry) {
	if node.NumOutputs() > 1 {
		// A multi-output node (GoMLX v0.28.16's fused attention: output and log-sum-exp) takes no Identity: its
		// entry is held in the graph's state instead, as long as the graph.
		node.Graph().AttachState(heldEntry{node}, e)
	} else {
		// The holder is an identity node nobody consumes: it is never executed (the executors only run what the
		// outputs need), but its gradient closure keeps e alive exactly as long as the graph.
		_ = graph.IdentityWithCustomGradient(node, func(x, v *graph.Node) *graph.Node {
			_ = e
			return v
		})
	}
	key := weak.Make(node)
	tableMu.Lock()
	_, existed := table[key]
	table[key] = weak.Make(e)
	tableMu.Unlock()
	if !existed {
		runtime.AddCleanup(node, func(k weak.Pointer[graph.Node]) {
			tableMu.Lock()
			delete(table, k)
			tableMu.Unlock()
		}, key)
	}
}

func lookup(node *graph.Node) *entry {
	tableMu.RLock()
	wp, ok := table[weak.Make(node)]
	tableMu.RUnlock()
	if !ok {
		return nil
	}
	return wp.Value()
}

// tableSize returns the number of live side-table entries (for leak tests).
func tableSize() int {
	tableMu.RLock()
	defer tableMu.RUnlock()
	return len(table)
}

// nextID returns the id the next node created in g will get.
func nextID(g *graph.Graph) graph.NodeId {
	last := g.LastNode()
	if last == nil {
		return 0
	}
	return last.Id() + 1
}
