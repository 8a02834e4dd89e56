package memory

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// The rules CheckOrder checks (OrderViolation.Rule).
const (
	// RuleHoistable: a large backward node can be computed from forward values alone, so XLA's scheduler may run
	// it during the forward pass and hold its result until the backward pass needs it (an untied recomputation).
	RuleHoistable = "hoistable"
	// RuleUnpinned: an 8-bit saved tensor (2-bit activation codes, Mesa's int8 codes) is not made behind a
	// barrier that the forward pass continues from, or the float tensor it replaces is saved as well, so XLA may
	// compute it late (or fuse it into its backward reader) and keep the float tensor alive.
	RuleUnpinned = "unpinned"
	// RuleUntied: a barrier built in the backward pass holds no cotangent (the gradient arriving at the backward
	// function that built it, or at the checkpointed block), so it does not stop its recomputation from starting
	// early.
	RuleUntied = "untied"
	// RuleOneOperand: a barrier with a single operand (go-xla drops those on XLA's CPU compiler).
	RuleOneOperand = "one-operand barrier"
)

// OrderViolation is one place where a differentiated graph leaves XLA free to undo a memory saving that the
// pure-Go backend's creation order gives (engine's "order is data": engine.Ties).
type OrderViolation struct {
	Rule   string       `json:"rule"`
	Node   graph.NodeId `json:"node"`
	Op     string       `json:"op"`
	Shape  shapes.Shape `json:"shape"`
	Bytes  int64        `json:"bytes"`
	Detail string       `json:"detail"`
}

// OrderReport is what CheckOrder found.
type OrderReport struct {
	// Violations lists the problems, by node.
	Violations []OrderViolation `json:"violations"`
	// MinBytes is the size from which a backward node counts as large.
	MinBytes int64 `json:"min_bytes"`
	// End is the forward position the backward pass starts from: the earliest forward node (by id, the
	// creation order the pure-Go backend runs) that every large cotangent depends on (see CheckOrder).
	End graph.NodeId `json:"end"`
	// Large, Pinned and Ties count what was checked: large backward nodes, 8-bit saved tensors and barriers built
	// in the backward pass.
	Large, Pinned, Ties int
}

// OK reports whether there is no violation.
func (r *OrderReport) OK() bool { return len(r.Violations) == 0 }

// Count returns the number of violations of rule.
func (r *OrderReport) Count(rule string) int {
	n := 0
	for _, v := range r.Violations {
		if v.Rule == rule {
			n++
		}
	}
	return n
}

// WriteText prints the report, one line per violation (at most limit lines; 0: all).
func (r *OrderReport) WriteText(w io.Writer, limit int) error {
	fmt.Fprintf(w, "order check: %d violation(s); %d large backward nodes (>= %s), %d 8-bit saved tensors, %d backward barriers checked; backward starts after forward node %d\n",
		len(r.Violations), r.Large, FormatBytes(r.MinBytes), r.Pinned, r.Ties, r.End)
	for i, v := range r.Violations {
		if limit > 0 && i == limit {
			fmt.Fprintf(w, "  ... %d more\n", len(r.Violations)-limit)
			break
		}
		fmt.Fprintf(w, "  %s: node %d %s %s (%s): %s\n", v.Rule, v.Node, v.Op, v.Shape, FormatBytes(v.Bytes), v.Detail)
	}
	return nil
}

// CheckOrder checks that a graph differentiated with engine.Gradient states by data dependences, not only by
// node creation order, the order its memory savings need, so that a backend that reorders and fuses freely (XLA)
// keeps what memory.Saved counts and nothing more. outputs are the step's outputs (what Saved walks back from);
// a backward node counts as large from minBytes. Three rules (engine's package documentation, order.go, says
// how engine builds what they check):
//
//   - RuleHoistable: every large backward node must depend on the backward pass itself. A node's position is
//     the latest forward node it depends on (its own id for a forward node; parameters and constants none);
//     End, the position the backward pass starts from, is the smallest position of any large cotangent (the
//     gradient arriving at a backward function: the loss's gradients depend on the logits' softmax, at the very
//     end of the forward pass, and every cotangent after them on those). A large backward node whose position
//     is before End could be computed during the forward pass and held. Nodes built from constants alone
//     (broadcast zeros, iotas) are not counted: they read nothing and are cheap to rebuild anywhere.
//   - RuleUnpinned: every 8-bit tensor in Saved(g, outputs...) must be an output of an optimization barrier
//     that also outputs a float tensor read by the forward pass (engine.Pin), and the float tensor it was made
//     from (the barrier's float operands, and the float inputs of those the codes were computed from directly,
//     such as an activation's input) must not be saved.
//   - RuleUntied: every optimization barrier built in the backward pass must hold an operand whose position
//     is End or later: a cotangent (engine.Recompute's tie, Checkpoint's), or a tensor computed from one.
//
// Every barrier must also have at least two operands (RuleOneOperand).
func CheckOrder(g *graph.Graph, minBytes int64, outputs ...*graph.Node) (*OrderReport, error) {
	info, ok := engine.GradientInfoOf(g)
	if !ok {
		return nil, engine.ErrNotDifferentiated
	}
	saved, err := Saved(g, outputs...)
	if err != nil {
		return nil, err
	}
	nodes := g.Nodes()
	needed := neededBy(len(nodes), outputs)
	// pos[id]: the latest forward node id depends on (-1: none); input[id]: whether it depends on a parameter
	// (or any non-constant leaf), i.e. is not a constant expression.
	pos := make([]graph.NodeId, len(nodes))
	input := make([]bool, len(nodes))
	consumers := make([][]graph.NodeId, len(nodes))
	for _, n := range nodes {
		id := n.Id()
		pos[id] = -1
		switch n.Type() {
		case graph.NodeTypeParameter:
			input[id] = true
			continue
		case graph.NodeTypeConstant:
			continue
		}
		for _, in := range n.Inputs() {
			consumers[in.Id()] = append(consumers[in.Id()], id)
			pos[id] = max(pos[id], pos[in.Id()])
			input[id] = input[id] || input[in.Id()]
		}
		if id < info.Boundary && len(n.Inputs()) > 0 {
			pos[id] = id
		}
	}
	bytesOf := func(n *graph.Node) int64 { return shapeBytes(n.Shape()) }

	rep := &OrderReport{MinBytes: minBytes, End: -1}
	for _, id := range info.Cotangents {
		if id < 0 || int(id) >= len(nodes) {
			continue
		}
		if bytesOf(nodes[id]) >= minBytes && (rep.End < 0 || pos[id] < rep.End) {
			rep.End = pos[id]
		}
	}
	if rep.End < 0 {
		return nil, fmt.Errorf("memory.CheckOrder: no cotangent of %s or more: the backward pass's start cannot be told (use a smaller minimum)", FormatBytes(minBytes))
	}
	violate := func(rule string, n *graph.Node, format string, args ...any) {
		rep.Violations = append(rep.Violations, OrderViolation{Rule: rule, Node: n.Id(), Op: n.Type().String(),
			Shape: n.Shape(), Bytes: bytesOf(n), Detail: fmt.Sprintf(format, args...)})
	}

	// Barriers: operands, and the backward ones' ties.
	for _, n := range nodes {
		if n.Type() != graph.NodeTypeOptimizationBarrier || !needed[n.Id()] {
			continue
		}
		if len(n.Inputs()) < 2 {
			violate(RuleOneOperand, n, "barrier over node %d alone", n.Inputs()[0].Id())
		}
		if n.Id() < info.Boundary {
			continue
		}
		rep.Ties++
		tied := false
		for _, in := range n.Inputs() {
			// A cotangent (Recompute's tie, Checkpoint's StopGradient of one), or anything computed from the
			// backward pass already (a Pin inside a checkpointed block's recomputation).
			if pos[in.Id()] >= rep.End {
				tied = true
				break
			}
		}
		if !tied {
			var ops []string
			for _, in := range n.Inputs() {
				ops = append(ops, fmt.Sprintf("%d", in.Id()))
			}
			violate(RuleUntied, n, "backward barrier over nodes %s holds no cotangent: what it feeds may start during the forward pass", strings.Join(ops, ", "))
		}
	}

	// Large backward nodes must sit after End.
	for _, n := range nodes {
		id := n.Id()
		if id < info.Boundary || !needed[id] || !input[id] || bytesOf(n) < minBytes {
			continue
		}
		rep.Large++
		if pos[id] < rep.End {
			at := "parameters alone"
			if pos[id] >= 0 {
				at = fmt.Sprintf("forward node %d (%s %s) and earlier", pos[id], nodes[pos[id]].Type(), nodes[pos[id]].Shape())
			}
			violate(RuleHoistable, n, "computable from %s, before the backward pass starts (after forward node %d)", at, rep.End)
		}
	}

	// 8-bit saved tensors must be pinned.
	isSaved := map[graph.NodeId]bool{}
	for _, t := range saved.Tensors {
		isSaved[t.Node] = true
	}
	for _, t := range saved.Tensors {
		if t.Shape.DType != dtypes.Uint8 && t.Shape.DType != dtypes.Int8 {
			continue
		}
		rep.Pinned++
		n := nodes[t.Node]
		var b *graph.Node
		if n.Type() == graph.NodeTypeSplitNode && n.Inputs()[0].Type() == graph.NodeTypeOptimizationBarrier {
			b = n.Inputs()[0]
		}
		if b == nil || len(b.Inputs()) < 2 {
			violate(RuleUnpinned, n, "8-bit saved tensor not made behind a barrier the forward pass continues from: it may be computed late and keep its float input alive")
			continue
		}
		// The barrier's float outputs read by the forward pass.
		forwardRead := false
		for _, sid := range consumers[b.Id()] {
			s := nodes[sid]
			if !s.DType().IsFloat() {
				continue
			}
			for _, c := range consumers[sid] {
				if c < info.Boundary {
					forwardRead = true
				}
			}
		}
		if !forwardRead {
			violate(RuleUnpinned, n, "the barrier over it (node %d) has no float output the forward pass reads", b.Id())
		}
		for _, f := range quantisationInputs(b, n.Shape().Size()) {
			if isSaved[f.Id()] {
				violate(RuleUnpinned, n, "the float tensor it was made from, node %d %s, is saved too", f.Id(), f.Shape())
			}
		}
	}
	sort.SliceStable(rep.Violations, func(i, j int) bool { return rep.Violations[i].Node < rep.Violations[j].Node })
	return rep, nil
}

// quantisationInputs returns the float tensors the integer operands of the pin barrier b were made from, of at
// least elems elements: b's float operands, and the float inputs of those operands that the integer operands
// reach without going through the operand (an activation's input x, from which both the activation y and its
// codes are computed).
func quantisationInputs(b *graph.Node, elems int) []*graph.Node {
	operand := map[*graph.Node]bool{}
	var floats, ints []*graph.Node
	for _, in := range b.Inputs() {
		operand[in] = true
		if in.DType().IsFloat() {
			floats = append(floats, in)
		} else {
			ints = append(ints, in)
		}
	}
	reached := map[*graph.Node]bool{}
	stack := append([]*graph.Node(nil), ints...)
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if reached[n] {
			continue
		}
		reached[n] = true
		if operand[n] && n.DType().IsFloat() {
			continue // through the operand itself: its own inputs are not the codes' direct inputs
		}
		stack = append(stack, n.Inputs()...)
	}
	var out []*graph.Node
	for _, f := range floats {
		if f.Shape().Size() >= elems {
			out = append(out, f)
		}
		for _, in := range f.Inputs() {
			if in.DType().IsFloat() && reached[in] && in.Shape().Size() >= elems {
				out = append(out, in)
			}
		}
	}
	return out
}
