package engine

import (
	"runtime"
	"sort"
	"sync"
	"weak"

	"github.com/gomlx/gomlx/core/graph"
)

// Span says that the backward nodes with ids in [From, To) were created by the VJP of forward node Forward,
// which was tagged Kind, called with the cotangent (the gradient arriving at Forward's output; for a
// multi-output node the first output's that received one) Cotangent.
type Span struct {
	From, To  graph.NodeId
	Forward   graph.NodeId
	Kind      Kind
	Cotangent graph.NodeId
}

// GradientInfo describes the backward part of a graph differentiated with Gradient.
type GradientInfo struct {
	// Boundary is the id of the first node created by Gradient: nodes with smaller ids are the forward pass.
	Boundary graph.NodeId
	// Spans lists, in creation order, which VJP created which backward nodes.
	Spans []Span
	// Cotangents lists the cotangent of every VJP call (the gradient arriving at the node whose VJP ran, see
	// Span.Cotangent), whether or not the VJP created nodes: the nodes the ordering ties hold (engine.Ties).
	Cotangents []graph.NodeId
}

// KindOfBackward returns the kind of the VJP that created backward node id, and false when id was created by
// Gradient's own bookkeeping (gradient accumulation, the initial ones) rather than by a VJP.
func (gi *GradientInfo) KindOfBackward(id graph.NodeId) (Kind, bool) {
	i := sort.Search(len(gi.Spans), func(i int) bool { return gi.Spans[i].To > id })
	if i < len(gi.Spans) && gi.Spans[i].From <= id {
		return gi.Spans[i].Kind, true
	}
	return KindOther, false
}

type gradRecord struct {
	mu    sync.Mutex
	info  GradientInfo
	valid bool // Gradient was called through engine.Gradient.
	// cotangent is the gradient arriving at the node whose VJP is running (Recompute's tie, see order.go);
	// unpinned counts the Checkpoint forward builds in progress, during which Pin does nothing.
	cotangent *graph.Node
	unpinned  int
}

var (
	recordsMu sync.Mutex
	records   = map[weak.Pointer[graph.Graph]]*gradRecord{}
)

func recordFor(g *graph.Graph, create bool) *gradRecord {
	key := weak.Make(g)
	recordsMu.Lock()
	defer recordsMu.Unlock()
	r := records[key]
	if r == nil && create {
		r = &gradRecord{}
		records[key] = r
		runtime.AddCleanup(g, func(k weak.Pointer[graph.Graph]) {
			recordsMu.Lock()
			delete(records, k)
			recordsMu.Unlock()
		}, key)
	}
	return r
}

func recordSpan(g *graph.Graph, from, to, forward graph.NodeId, kind Kind, cotangent graph.NodeId) {
	r := recordFor(g, true)
	r.mu.Lock()
	r.info.Cotangents = append(r.info.Cotangents, cotangent)
	if from == to {
		r.mu.Unlock()
		return
	}
	r.info.Spans = append(r.info.Spans, Span{From: from, To: to, Forward: forward, Kind: kind, Cotangent: cotangent})
	r.mu.Unlock()
}

// Gradient returns the gradients of the scalar loss with respect to each node in wrt, like graph.Gradient, with
// the VJPs set with SetVJP (and PassThrough) in place of GoMLX's for those nodes, and records where the backward
// pass starts and which VJP created each backward node, so that the memory package can list what it keeps. Call
// it once per graph.
//
// It is the only way memfit's VJPs apply: engine leaves graph.VJPRegistration as GoMLX made it, so
// graph.Gradient, even on a graph memfit built, uses GoMLX's gradients everywhere. Gradient differentiates like
// graph.Gradient except for GoMLX fused ops that carry a decomposed alternate for their gradient (graph.Softmax,
// nn.LayerNorm and the like while the backend fuses them), which it cannot see: see the package documentation.
func Gradient(loss *graph.Node, wrt ...*graph.Node) []*graph.Node {
	g := loss.Graph()
	r := recordFor(g, true)
	r.mu.Lock()
	r.info = GradientInfo{Boundary: nextID(g)}
	r.valid = true
	r.mu.Unlock()
	return gradient(loss, wrt)
}

// GradientInfoOf returns what Gradient recorded for g, or false if g was not differentiated with Gradient.
func GradientInfoOf(g *graph.Graph) (GradientInfo, bool) {
	r := recordFor(g, false)
	if r == nil {
		return GradientInfo{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.valid {
		return GradientInfo{}, false
	}
	info := GradientInfo{Boundary: r.info.Boundary, Spans: append([]Span(nil), r.info.Spans...),
		Cotangents: append([]graph.NodeId(nil), r.info.Cotangents...)}
	sort.Slice(info.Spans, func(i, j int) bool { return info.Spans[i].From < info.Spans[j].From })
	return info, true
}
