package memory

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// MethodSavedWalk labels saved-activation figures: they are exact, read off the training graph.
const MethodSavedWalk = "exact: forward tensors read by the backward pass (training-graph walk)"

// SavedTensor is one forward tensor that the backward pass reads.
type SavedTensor struct {
	// Node is the forward node's id in its graph.
	Node graph.NodeId
	// Op is the forward node's type (e.g. "Mul", "DotGeneral").
	Op string
	// Shape is the tensor's shape and dtype.
	Shape shapes.Shape
	// Bytes is the tensor's size in memory.
	Bytes int64
	// Kind is the op kind charged with the tensor: when several backward ops read it (a memory-sharing norm's
	// output read by the norm and the next linear layer, say) it is counted once, for the first of linear,
	// attention, activation, norm, other.
	Kind engine.Kind
	// ReadBy lists the kinds of all backward ops that read it.
	ReadBy []engine.Kind
	// Producer is the kind the forward node itself was tagged with.
	Producer engine.Kind
}

// SavedReport lists what one training step keeps between its forward and backward passes.
type SavedReport struct {
	Tensors []SavedTensor
	// Total is the sum of Tensors' bytes.
	Total int64
	// ByKind sums Bytes per Kind.
	ByKind map[engine.Kind]int64
	// Method says how the figures were obtained (always MethodSavedWalk).
	Method string
}

// kindPriority orders kinds for charging a tensor read by several ops.
var kindPriority = []engine.Kind{engine.KindLinear, engine.KindAttention, engine.KindActivation, engine.KindNorm, engine.KindOther}

// Saved walks a graph differentiated with engine.Gradient and returns every forward tensor that a backward node
// needed by outputs reads. outputs must be the nodes the step compiles (the loss, the gradients, ...): backward
// nodes that none of them needs are never executed and keep nothing. Parameters and constants are not
// activations (they are resident whatever the method) and are not listed.
func Saved(g *graph.Graph, outputs ...*graph.Node) (*SavedReport, error) {
	info, ok := engine.GradientInfoOf(g)
	if !ok {
		return nil, engine.ErrNotDifferentiated
	}
	if len(outputs) == 0 {
		return nil, fmt.Errorf("memory.Saved: no outputs given")
	}
	for _, o := range outputs {
		if o.Graph() != g {
			return nil, fmt.Errorf("memory.Saved: output %s belongs to another graph", o)
		}
	}
	nodes := g.Nodes()
	needed := neededBy(len(nodes), outputs)

	readers := map[graph.NodeId]map[engine.Kind]bool{}
	for _, n := range nodes {
		if n.Id() < info.Boundary || !needed[n.Id()] {
			continue
		}
		kind, _ := info.KindOfBackward(n.Id())
		for _, in := range n.Inputs() {
			if in.Id() >= info.Boundary {
				continue
			}
			switch in.Type() {
			case graph.NodeTypeParameter, graph.NodeTypeConstant:
				continue
			}
			if readers[in.Id()] == nil {
				readers[in.Id()] = map[engine.Kind]bool{}
			}
			readers[in.Id()][kind] = true
		}
	}

	rep := &SavedReport{ByKind: map[engine.Kind]int64{}, Method: MethodSavedWalk}
	for id, kinds := range readers {
		n := nodes[id]
		t := SavedTensor{Node: id, Op: n.Type().String(), Shape: n.Shape(), Bytes: shapeBytes(n.Shape()),
			Producer: engine.KindOf(n)}
		for _, k := range kindPriority {
			if kinds[k] {
				t.ReadBy = append(t.ReadBy, k)
			}
		}
		t.Kind = t.ReadBy[0]
		rep.Tensors = append(rep.Tensors, t)
		rep.Total += t.Bytes
		rep.ByKind[t.Kind] += t.Bytes
	}
	sort.Slice(rep.Tensors, func(i, j int) bool { return rep.Tensors[i].Node < rep.Tensors[j].Node })
	return rep, nil
}

// neededBy marks, among n nodes, those the outputs depend on (the outputs included): what executing them runs.
func neededBy(n int, outputs []*graph.Node) []bool {
	needed := make([]bool, n)
	stack := append([]*graph.Node(nil), outputs...)
	for len(stack) > 0 {
		node := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if needed[node.Id()] {
			continue
		}
		needed[node.Id()] = true
		stack = append(stack, node.Inputs()...)
	}
	return needed
}

// shapeBytes is the bytes of a tensor of shape s, or of all the outputs of a multi-output node (a tuple shape:
// GoMLX v0.28.16's fused attention keeps its output and log-sum-exp, which its backward reads through split
// nodes it creates in the backward pass).
func shapeBytes(s shapes.Shape) int64 {
	if s.IsTuple() {
		var b int64
		for _, e := range s.TupleShapes {
			b += shapeBytes(e)
		}
		return b
	}
	return int64(s.Memory())
}

// Find returns the saved tensors whose shape has the given dimensions (any dtype).
func (r *SavedReport) Find(dims ...int) []SavedTensor {
	var out []SavedTensor
	for _, t := range r.Tensors {
		if equalDims(t.Shape.Dimensions, dims) {
			out = append(out, t)
		}
	}
	return out
}

// Lookup returns the saved tensor produced by node id, if any.
func (r *SavedReport) Lookup(id graph.NodeId) (SavedTensor, bool) {
	for _, t := range r.Tensors {
		if t.Node == id {
			return t, true
		}
	}
	return SavedTensor{}, false
}

// WriteTable prints the tensors and the totals by kind.
func (r *SavedReport) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "node\top\tshape\tbytes\tkind\tread by\t\n")
	for _, t := range r.Tensors {
		reads := make([]string, len(t.ReadBy))
		for i, k := range t.ReadBy {
			reads[i] = k.String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t\n", t.Node, t.Op, t.Shape, t.Bytes, t.Kind, strings.Join(reads, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "saved activations (%s): %s in %d tensors;", r.Method, FormatBytes(r.Total), len(r.Tensors))
	for _, k := range engine.Kinds {
		if b := r.ByKind[k]; b > 0 {
			fmt.Fprintf(w, " %s %s", k, FormatBytes(b))
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}

// FormatBytes prints a byte count in binary units (B, KiB, MiB, GiB) with three significant decimals.
func FormatBytes(b int64) string { return FormatBytesPrec(b, 3) }

// FormatBytesPrec is FormatBytes with the given number of decimals (FormatBytesPrec(b, 1): "97.2 MiB").
func FormatBytesPrec(b int64, decimals int) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	v := float64(b)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= unit
		if v < unit {
			return fmt.Sprintf("%.*f %s", decimals, v, u)
		}
	}
	return fmt.Sprintf("%.*f PiB", decimals, v/unit)
}

func equalDims(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
