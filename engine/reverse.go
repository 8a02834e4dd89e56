package engine

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
)

// gradient returns the gradients of the scalar loss with respect to each node in wrt. It is graph.Gradient's
// algorithm (GoMLX v0.28.16, core/graph/rev_autodiff.go) run by engine itself, so that a node's VJP can come from
// engine's side table (SetVJP) without any change to graph.VJPRegistration, which it only reads: it visits the
// nodes in the same order, calls the same gradient functions with the same arguments and accumulates their
// results in the same order, so for a graph with no custom VJP it builds the very backward nodes graph.Gradient
// builds. For each node it uses, in order: the node's GoMLX custom gradient (graph.IdentityWithCustomGradient),
// the VJP set with SetVJP, GoMLX's graph.VJPRegistration. It records which backward nodes each VJP created
// (recordSpan).
//
// Two features of graph.Gradient need node fields GoMLX does not export, and are not reproduced (engine.Gradient
// documents it): the decomposed alternates of fused ops built by graph.InternalFusedOpCaller with
// useDecomposedAlternateVJP (graph.Softmax, nn.Dense, nn.LayerNorm and GoMLX's activation layers when the backend
// fuses them: gradient's node gets the fused op's registered VJP, or a panic naming it where it has none), and
// the rematerialisation of GoMLX's Node.Checkpoint blocks (their nodes' forward values are kept instead). memfit's
// graphs use neither: its fused ops carry their own VJPs (or, for the flash attention, the op's registered one),
// and its checkpointing is Checkpoint.
func gradient(loss *graph.Node, wrt []*graph.Node) []*graph.Node {
	g := checkGradientInputs(loss, wrt)
	lossShape := loss.Shape()
	nodes := g.Nodes()
	n := len(nodes)

	// The reverse graph: who consumes each node, which nodes the loss depends on (included) and which of those
	// lie on a path from a wrt node to the loss (useful).
	consumers := make([][]graph.NodeId, n)
	for _, node := range nodes {
		for _, in := range node.Inputs() {
			consumers[in.Id()] = append(consumers[in.Id()], node.Id())
		}
	}
	included := make([]bool, n)
	stack := []*graph.Node{loss}
	for len(stack) > 0 {
		node := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if included[node.Id()] {
			continue
		}
		included[node.Id()] = true
		stack = append(stack, node.Inputs()...)
	}
	useful := make([]bool, n)
	ids := make([]graph.NodeId, 0, len(wrt))
	for _, w := range wrt {
		ids = append(ids, w.Id())
	}
	for len(ids) > 0 {
		id := ids[len(ids)-1]
		ids = ids[:len(ids)-1]
		if !included[id] || useful[id] {
			continue
		}
		useful[id] = true
		ids = append(ids, consumers[id]...)
	}
	needGradient := func(node *graph.Node) bool {
		return !node.StopGradient() && included[node.Id()] && useful[node.Id()]
	}

	// accumulated[id] is the gradient of the loss with respect to node id's output, once all its consumers have
	// been visited; multi[id] holds the gradients of a multi-output node's outputs.
	accumulated := make([]*graph.Node, n)
	multi := make([][]*graph.Node, n)
	for _, node := range nodes {
		if node.NumOutputs() > 1 {
			multi[node.Id()] = make([]*graph.Node, node.NumOutputs())
		}
	}
	accumulated[loss.Id()] = graph.Ones(g, shapes.Make(lossShape.DType))

	// Nodes are numbered in creation order, so going down from the loss visits every consumer of a node before
	// the node itself.
	for id := loss.Id(); id >= 0; id-- {
		node := nodes[id]
		if !needGradient(node) || !slices.ContainsFunc(node.Inputs(), needGradient) {
			continue
		}
		var vjps []*graph.Node
		var cotangent *graph.Node // the first gradient that arrived, Recompute's tie (order.go)
		barrier := node.Type() == graph.NodeTypeOptimizationBarrier && isOwnBarrier(node)
		if node.NumOutputs() > 1 {
			vjps = multi[id]
			if i := slices.IndexFunc(vjps, func(v *graph.Node) bool { return v != nil }); i < 0 {
				continue // no gradient arrives at any output
			} else {
				cotangent = vjps[i]
			}
			var outShapes []shapes.Shape
			for i, v := range vjps {
				if v != nil || barrier {
					// engine's own barriers (barriers) pass each output's gradient to its own operand, and
					// none where none arrived (a pinned residual, Pin; a tie, Checkpoint), instead of a zero
					// tensor that would then flow on into the integer code chain or the backward graph. (A
					// barrier engine did not build keeps GoMLX's zeros, as graph.Gradient builds them.)
					continue
				}
				if outShapes == nil {
					outShapes = outputShapes(node, nodes, consumers[id])
				}
				vjps[i] = graph.Zeros(g, outShapes[i])
			}
		} else {
			if accumulated[id] == nil {
				continue // a stop-gradient consumer: nothing arrives
			}
			vjps = []*graph.Node{accumulated[id]}
			cotangent = vjps[0]
		}

		if node.Type() == graph.NodeTypeSplitNode {
			// A split node hands its gradient to its element of the multi-output node.
			m := node.Inputs()[0]
			i := splitIndex(node, m)
			if multi[m.Id()][i] == nil {
				multi[m.Id()][i] = vjps[0]
			} else {
				multi[m.Id()][i] = graph.Add(multi[m.Id()][i], vjps[0])
			}
			continue
		}

		e := lookup(node)
		first := nextID(g)
		prevTie := setCotangent(g, cotangent)
		var grads []*graph.Node
		switch {
		case barrier:
			grads = slices.Clone(vjps)
		case node.CustomGradient() != nil:
			grads = node.CustomGradient()(node, vjps, lossShape)
		case e != nil && e.vjp != nil:
			if node.NumOutputs() != 1 {
				panic(fmt.Sprintf("engine: custom VJP on multi-output node %s is not supported", node))
			}
			grads = e.vjp(node, vjps[0])
		default:
			fn, ok := graph.VJPRegistration[node.Type()]
			if !ok {
				panic(noGradient(node))
			}
			grads = fn(node, vjps, lossShape)
		}
		setCotangent(g, prevTie)
		kind := KindOther
		if e != nil {
			kind = e.kind
		}
		recordSpan(g, first, nextID(g), node.Id(), kind, cotangent.Id())

		inputs := node.Inputs()
		if len(grads) != len(inputs) {
			panic(fmt.Sprintf("VJP of %s returned %d gradients for its %d inputs", node, len(grads), len(inputs)))
		}
		for i, in := range inputs {
			v := grads[i]
			if v == nil {
				continue
			}
			if !v.Shape().Equal(in.Shape()) {
				panic(fmt.Sprintf("invalid gradient for input #%d (of %d) of node %s: input shape %s, gradient shape %s",
					i, len(inputs), node, in.Shape(), v.Shape()))
			}
			if accumulated[in.Id()] == nil {
				accumulated[in.Id()] = v
			} else {
				accumulated[in.Id()] = graph.Add(accumulated[in.Id()], v)
			}
		}
	}

	grads := make([]*graph.Node, len(wrt))
	for i, w := range wrt {
		if accumulated[w.Id()] == nil {
			grads[i] = graph.ZerosLike(w) // no path from w to the loss (or a stop-gradient on it)
		} else {
			grads[i] = accumulated[w.Id()]
		}
	}
	return grads
}

// checkGradientInputs panics, as graph.Gradient does, unless loss is a real scalar and loss and wrt are valid
// single-output nodes of one graph being built; it returns that graph.
func checkGradientInputs(loss *graph.Node, wrt []*graph.Node) *graph.Graph {
	var g *graph.Graph
	for i, node := range append([]*graph.Node{loss}, wrt...) {
		if node == nil {
			panic(fmt.Sprintf("engine.Gradient: node %d (0 is the loss) is nil", i))
		}
		node.AssertValid()
		if node.NumOutputs() != 1 {
			panic(fmt.Sprintf("engine.Gradient: node %s has %d outputs", node, node.NumOutputs()))
		}
		if g == nil {
			g = node.Graph()
			g.AssertBuilding()
		} else if node.Graph() != g {
			panic(fmt.Sprintf("engine.Gradient: node %s belongs to graph %q, the loss to %q", node, node.Graph().Name(), g.Name()))
		}
	}
	if s := loss.Shape(); s.Rank() > 0 || s.DType.IsComplex() {
		panic(fmt.Sprintf("engine.Gradient: the loss must be a real scalar, got %s", s))
	}
	return g
}

// splitIndex returns which output of the multi-output node m the split node s selects. GoMLX does not export
// the index, but a split node's backend value is its element of m's backend values (graph.splitNode), so it is
// the one equal to it; where that is not decisive (a backend value type that is not comparable, or two outputs
// with the same value) it is read from the node's description, "SplitNode(multiOutputNode=[#m], index=i)".
func splitIndex(s, m *graph.Node) int {
	v := graph.InternalBackendOutputs(s)[0]
	at := -1
	if v != nil && reflect.TypeOf(v).Comparable() {
		for i, o := range graph.InternalBackendOutputs(m) {
			if o != nil && reflect.TypeOf(o) == reflect.TypeOf(v) && o == v {
				if at >= 0 {
					at = -1
					break
				}
				at = i
			}
		}
	}
	if at >= 0 {
		return at
	}
	str := s.String()
	if k := strings.Index(str, "index="); k >= 0 {
		digits := str[k+len("index="):]
		if end := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); end >= 0 {
			digits = digits[:end]
		}
		if i, err := strconv.Atoi(digits); err == nil && i < m.NumOutputs() {
			return i
		}
	}
	panic(fmt.Sprintf("engine.Gradient: cannot tell which output of %s the split node %s selects", m, s))
}

// outputShapes returns the shapes of the multi-output node m's outputs, read off its split nodes (GoMLX does
// not export a multi-output node's shapes; graph.splitNode makes one split node per output).
func outputShapes(m *graph.Node, nodes []*graph.Node, consumers []graph.NodeId) []shapes.Shape {
	out := make([]shapes.Shape, m.NumOutputs())
	found := make([]bool, m.NumOutputs())
	for _, id := range consumers {
		c := nodes[id]
		if c.Type() != graph.NodeTypeSplitNode {
			continue
		}
		i := splitIndex(c, m)
		out[i], found[i] = c.Shape(), true
	}
	for i, ok := range found {
		if !ok {
			panic(fmt.Sprintf("engine.Gradient: output %d of %s has no split node, its shape is unknown", i, m))
		}
	}
	return out
}

// noGradient is the panic message for a node on the gradient path with no gradient function.
func noGradient(node *graph.Node) string {
	msg := fmt.Sprintf("engine.Gradient: graph has node %s with type %q, for which no gradient is defined (neither GoMLX's graph.VJPRegistration nor engine.SetVJP has one)", node, node.Type())
	if strings.HasPrefix(node.Type().String(), "Fused") {
		msg += "; GoMLX differentiates such a fused op through a decomposed alternate it keeps in an unexported field " +
			"(graph.Softmax, nn.LayerNorm, ... while the backend fuses them), which engine.Gradient cannot read: " +
			"build the op with GOMLX_FUSION=0, or with memfit's builder (attention.Softmax), or give it a VJP with engine.SetVJP"
	}
	return msg
}
