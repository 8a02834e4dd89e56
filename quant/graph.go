package quant

import (
	"fmt"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
)

// Tensor name suffixes of an NF4 weight stored as model parameters (after the layer's "<path>.weight").
const (
	SuffixCodes    = ".nf4_codes"    // uint8 [blocks*32]: two codes per byte, high nibble first (padded to whole blocks)
	SuffixAbsmax   = ".nf4_absmax"   // float32 [blocks], without double quantisation
	SuffixAbsmaxQ  = ".nf4_absmax_q" // uint8 [groups*256] (padded to whole groups)
	SuffixAbsmax2  = ".nf4_absmax2"  // float32 [groups]
	SuffixOffset   = ".nf4_offset"   // float32 [1]
	SuffixColScale = ".nf4_colscale" // float32 [in], absent when 1
)

// Tensors returns q as named tensors (prefix is "<layer path>.weight"), padded to whole blocks and groups so the
// graph can reshape them.
func (q *NF4) Tensors(prefix string) map[string]*tensors.Tensor {
	n := q.Out * q.In
	blocks := (n + BlockSize - 1) / BlockSize
	codes := make([]uint8, blocks*BlockSize/2)
	copy(codes, q.Codes)
	out := map[string]*tensors.Tensor{prefix + SuffixCodes: tensors.FromFlatDataAndDimensions(codes, len(codes))}
	if q.AbsmaxQ == nil {
		out[prefix+SuffixAbsmax] = tensors.FromFlatDataAndDimensions(append([]float32(nil), q.Absmax...), blocks)
	} else {
		groups := len(q.Absmax2)
		aq := make([]uint8, groups*DQBlockSize)
		copy(aq, q.AbsmaxQ)
		out[prefix+SuffixAbsmaxQ] = tensors.FromFlatDataAndDimensions(aq, len(aq))
		out[prefix+SuffixAbsmax2] = tensors.FromFlatDataAndDimensions(append([]float32(nil), q.Absmax2...), groups)
		out[prefix+SuffixOffset] = tensors.FromFlatDataAndDimensions([]float32{q.Offset}, 1)
	}
	if q.ColScale != nil {
		out[prefix+SuffixColScale] = tensors.FromFlatDataAndDimensions(append([]float32(nil), q.ColScale...), q.In)
	}
	return out
}

// Shapes returns the shapes of the tensors NF4 quantisation of an [out, in] weight stores (double: with double
// quantisation; colScale: with a folded norm), by suffix.
func Shapes(out, in int, double, colScale bool) map[string]shapes.Shape {
	n := out * in
	blocks := (n + BlockSize - 1) / BlockSize
	s := map[string]shapes.Shape{SuffixCodes: shapes.Make(dtypes.Uint8, blocks*BlockSize/2)}
	if double {
		groups := (blocks + DQBlockSize - 1) / DQBlockSize
		s[SuffixAbsmaxQ] = shapes.Make(dtypes.Uint8, groups*DQBlockSize)
		s[SuffixAbsmax2] = shapes.Make(dtypes.Float32, groups)
		s[SuffixOffset] = shapes.Make(dtypes.Float32, 1)
	} else {
		s[SuffixAbsmax] = shapes.Make(dtypes.Float32, blocks)
	}
	if colScale {
		s[SuffixColScale] = shapes.Make(dtypes.Float32, in)
	}
	return s
}

// Nodes are the graph parameters of one NF4 weight (AbsmaxQ, Absmax2 and Offset with double quantisation,
// Absmax without; ColScale may be nil).
type Nodes struct {
	Codes, Absmax, AbsmaxQ, Absmax2, Offset, ColScale *graph.Node
}

// Dequantize builds the weight [out, in] in dtype from its NF4 parameters:
//
//	scale[b] = absmax[b], or DynamicMap[absmax_q[b]] * absmax2[b / 256] + offset when double-quantised
//	w[i]     = NF4Code[code(i)] * scale[i / 64] * colscale[i mod in]
//
// where code(i) is the high nibble of byte i/2 for even i and the low nibble for odd i. The code books are
// constants read with Gather (NF4's as a 256-row table of nibble pairs, indexed by the code bytes). Nothing here is trainable, so no gradient flows into these nodes.
func Dequantize(p Nodes, out, in int, dtype dtypes.DType) *graph.Node {
	g := p.Codes.Graph()
	n := out * in
	bytes := p.Codes.Shape().Size()
	blocks := 2 * bytes / BlockSize
	if blocks*BlockSize < n {
		panic(fmt.Sprintf("quant: %d code bytes cannot hold a [%d, %d] weight", bytes, out, in))
	}
	// One Gather over the code bytes: row b of the [256, 2] table holds the code book values of b's high and
	// low nibble, in element order. (Splitting the nibbles with uint8 division and remainder, then gathering per
	// element, took three times as long on the pure-Go backend: its Gather costs per index, and its uint8
	// arithmetic has no vector kernels.)
	vals := graph.Gather(graph.Const(g, nf4BytePairs()), graph.Reshape(p.Codes, bytes, 1)) // [bytes, 2]
	var scale *graph.Node
	if p.AbsmaxQ != nil {
		groups := p.Absmax2.Shape().Size()
		dyn := graph.Gather(graph.Const(g, DynamicMap[:]), graph.ConvertDType(graph.Reshape(p.AbsmaxQ, groups*DQBlockSize, 1), dtypes.Int32))
		dq := graph.Mul(graph.Reshape(dyn, groups, DQBlockSize), graph.Reshape(p.Absmax2, groups, 1))
		scale = graph.Add(graph.Reshape(dq, groups*DQBlockSize), p.Offset)
		if groups*DQBlockSize != blocks {
			scale = engine.SliceAxis(scale, 0, 0, blocks) // engine: a Slice gradient would need Pad
		}
	} else {
		scale = p.Absmax
	}
	w := graph.Mul(graph.Reshape(vals, blocks, BlockSize), graph.Reshape(scale, blocks, 1))
	w = graph.Reshape(w, blocks*BlockSize)
	if blocks*BlockSize != n {
		w = engine.SliceAxis(w, 0, 0, n)
	}
	w = graph.Reshape(w, out, in)
	if p.ColScale != nil {
		w = graph.Mul(w, graph.Reshape(p.ColScale, 1, in))
	}
	if dtype != dtypes.Float32 {
		w = graph.ConvertDType(w, dtype)
	}
	return w
}

// nf4BytePairs returns the [256][2] table whose row b is NF4Code of b's high nibble and of its low nibble.
func nf4BytePairs() [][]float32 {
	t := make([][]float32, 256)
	for b := range t {
		t[b] = []float32{NF4Code[b/16], NF4Code[b%16]}
	}
	return t
}

// Weight dequantises the NF4 weight for a linear layer and marks it recomputable, so the backward pass of the
// matmul that reads it rebuilds it from the codes (engine.Fresh) instead of keeping the full-precision weight
// from the forward pass.
//
// The rebuild reads the codes and scales through engine.Recompute: an optimization barrier, so that no backend
// merges it with the forward dequantisation (GoMLX v0.28's Go backend de-duplicates identical nodes, XLA
// eliminates common subexpressions), which would keep the forward's full-precision weight alive after all.
func Weight(p Nodes, out, in int, dtype dtypes.DType) *graph.Node {
	return engine.Recomputable(Dequantize(p, out, in, dtype), func() *graph.Node { return Dequantize(p.recomputed(), out, in, dtype) })
}

// recomputed returns p with every node read through engine.Recompute.
func (p Nodes) recomputed() Nodes {
	fields := []**graph.Node{&p.Codes, &p.Absmax, &p.AbsmaxQ, &p.Absmax2, &p.Offset, &p.ColScale}
	var nodes []*graph.Node
	for _, f := range fields {
		if *f != nil {
			nodes = append(nodes, *f)
		}
	}
	fresh := engine.Recompute(nodes...)
	for _, f := range fields {
		if *f != nil {
			*f, fresh = fresh[0], fresh[1:]
		}
	}
	return p
}

// BoundNodes looks up the NF4 parameters of the weight prefix ("<path>.weight") in nodes; ok is false when the
// weight is not quantised.
func BoundNodes(nodes map[string]*graph.Node, prefix string) (Nodes, bool) {
	p := Nodes{Codes: nodes[prefix+SuffixCodes], Absmax: nodes[prefix+SuffixAbsmax], AbsmaxQ: nodes[prefix+SuffixAbsmaxQ],
		Absmax2: nodes[prefix+SuffixAbsmax2], Offset: nodes[prefix+SuffixOffset], ColScale: nodes[prefix+SuffixColScale]}
	if p.Codes == nil || (p.Absmax == nil && (p.AbsmaxQ == nil || p.Absmax2 == nil || p.Offset == nil)) {
		return Nodes{}, false
	}
	return p, true
}
