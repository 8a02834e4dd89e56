package quant

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// Mesa layer kinds: which saved tensors are stored as int8.
const (
	MesaActivation = "act"     // GELU / SiLU inputs
	MesaNorm       = "norm"    // norm outputs z (with MS-norm: the tensor the norm and the next linear share)
	MesaSoftmax    = "softmax" // attention probabilities
	MesaAttention  = "attn"    // the attention matmuls' q, k, v operands
	MesaLinear     = "linear"  // linear-layer inputs kept for a trainable weight's gradient
)

// MesaKinds lists the kinds in a stable order.
var MesaKinds = []string{MesaActivation, MesaNorm, MesaSoftmax, MesaAttention, MesaLinear}

// ParseMesa checks a list of Mesa kinds ("all" selects every kind).
func ParseMesa(kinds []string) ([]string, error) {
	var out []string
	for _, k := range kinds {
		k = strings.TrimSpace(k)
		if k == "all" {
			return append([]string(nil), MesaKinds...), nil
		}
		ok := false
		for _, m := range MesaKinds {
			ok = ok || k == m
		}
		if !ok {
			return nil, fmt.Errorf("unknown Mesa kind %q (use %s or all)", k, strings.Join(MesaKinds, ", "))
		}
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}

// MesaDecay is the momentum of the running range estimates: range = decay * range + (1 - decay) * batch range.
const MesaDecay = 0.9

// MesaGroups is the number of channel groups of a [..., C] tensor (each with its own range).
const MesaGroups = 8

// Mesa stores selected saved activations of one training step as int8 (Mesa, Pan et al. 2021): every tensor
// marked with Keep is quantised in the forward pass, asymmetrically per group (attention heads, or channel
// groups), with stochastic rounding and clamping to [0, 255] at both ends, and dequantised in the backward pass
// in place of the original (engine.Recomputable / Fresh), so the backward keeps 1 byte per value.
//
// Ranges are running estimates carried across steps as state: each Keep adds a graph parameter
// "mesa.<n>" [groups, 3] (min, max, initialised flag) and an output with its update; the first batch
// initialises it. The caller feeds the states (zeros at the start) and stores the outputs (Inputs/Outputs).
type Mesa struct {
	Kinds map[string]bool
	RNG   *engine.RNG
	// MesaState holds the range states of every view of this Mesa (Only).
	*MesaState
}

// MesaState is the running-range state of a step's Mesa: the state parameters and their updates, in creation
// order, shared by a Mesa and its views.
type MesaState struct {
	Names   []string
	In, Out []*graph.Node
}

// NewMesa returns a Mesa over the given kinds drawing rounding noise from rng.
func NewMesa(kinds []string, rng *engine.RNG) *Mesa {
	return &Mesa{Kinds: kindSet(kinds), RNG: rng, MesaState: &MesaState{}}
}

// Only returns a view of m that stores the given kinds (a block's own choice in a per-block memory plan); its
// range states join m's. A nil m gives nil.
func (m *Mesa) Only(kinds []string) *Mesa {
	if m == nil {
		return nil
	}
	return &Mesa{Kinds: kindSet(kinds), RNG: m.RNG, MesaState: m.MesaState}
}

func kindSet(kinds []string) map[string]bool {
	out := map[string]bool{}
	for _, k := range kinds {
		out[k] = true
	}
	return out
}

// Enabled reports whether kind is stored as int8.
func (m *Mesa) Enabled(kind string) bool { return m != nil && m.RNG != nil && m.Kinds[kind] }

// Keep marks x (a tensor some backward pass reads) to be kept as int8 when kind is enabled, and returns what the
// forward pass continues with: x itself, or, with ordering ties on (engine.Ties), x behind a barrier that also
// holds the int8 codes and their scales (engine.Pin), so that the quantisation runs in the forward pass and x can
// die there. Backward functions read either through engine.Fresh, which rebuilds the float tensor from the codes.
// groupAxis >= 0 groups by that axis (attention heads); -1 splits the last axis into MesaGroups channel groups
// (fewer when it does not divide).
func (m *Mesa) Keep(kind string, x *graph.Node, groupAxis int) *graph.Node {
	if !m.Enabled(kind) || !x.DType().IsFloat() {
		return x
	}
	g := x.Graph()
	dims := x.Shape().Dimensions
	rank := len(dims)
	// No StopGradient here: nothing computed from xf reaches the loss (the codes are integers read only by the
	// backward's rebuild, the range goes to the state output), so no gradient flows through it anyway, and GoMLX's
	// StopGradient is an Identity that the pure-Go backend copies (an x-sized copy per kept tensor).
	xf := graph.ConvertDType(x, dtypes.Float32)
	// The per-group range. Groups along an axis reduce over every other axis. Channel groups (groupAxis -1) reduce
	// the leading axes first, to one value per channel, and then each group's channels: no x-sized regrouping
	// copy (a Reshape of x, which the forward pass still reads, is one on the pure-Go backend).
	var groups int
	var bmin, bmax *graph.Node // [groups]
	if groupAxis >= 0 {
		groups = dims[groupAxis]
		var others []int
		for a := range rank {
			if a != groupAxis {
				others = append(others, a)
			}
		}
		bmin, bmax = graph.ReduceMin(xf, others...), graph.ReduceMax(xf, others...)
	} else {
		c := dims[rank-1]
		groups = MesaGroups
		for c%groups != 0 {
			groups--
		}
		leading := make([]int, rank-1)
		for a := range leading {
			leading[a] = a
		}
		perChannel := func(reduce func(*graph.Node, ...int) *graph.Node) *graph.Node {
			v := xf
			if rank > 1 {
				v = reduce(xf, leading...)
			}
			return reduce(graph.Reshape(v, groups, c/groups), 1)
		}
		bmin, bmax = perChannel(graph.ReduceMin), perChannel(graph.ReduceMax)
	}
	name := fmt.Sprintf("mesa.%d", len(m.Names))
	state := graph.Parameter(g, name, shapes.Make(dtypes.Float32, groups, 3))
	smin := graph.Reshape(engine.SliceAxis(state, 1, 0, 1), groups)
	smax := graph.Reshape(engine.SliceAxis(state, 1, 1, 2), groups)
	init := graph.Reshape(engine.SliceAxis(state, 1, 2, 3), groups)
	started := graph.GreaterThan(init, graph.ZerosLike(init))
	nmin := graph.Where(started, graph.Add(graph.MulScalar(smin, MesaDecay), graph.MulScalar(bmin, 1-MesaDecay)), bmin)
	nmax := graph.Where(started, graph.Add(graph.MulScalar(smax, MesaDecay), graph.MulScalar(bmax, 1-MesaDecay)), bmax)
	next := graph.Concatenate([]*graph.Node{graph.Reshape(nmin, groups, 1), graph.Reshape(nmax, groups, 1), graph.OnesLike(graph.Reshape(init, groups, 1))}, 1)
	m.Names, m.In, m.Out = append(m.Names, name), append(m.In, state), append(m.Out, next)

	// The per-group range spread to a small tensor that broadcasts over x in a pattern the pure-Go backend's
	// vector kernels take: one value per channel [1, .., C] for channel groups (x [..., C] against its last axis), and
	// per (leading axes, group) [d0, .., G, 1, .., 1] for groups along an axis (x against its trailing axes).
	spread := func(v *graph.Node) *graph.Node {
		if groupAxis < 0 {
			c := dims[rank-1]
			return graph.ExpandLeftToRank(graph.Reshape(graph.BroadcastToDims(graph.Reshape(v, groups, 1), groups, c/groups), c), rank)
		}
		bdims := make([]int, rank)
		for a := range bdims {
			bdims[a] = 1
			if a <= groupAxis {
				bdims[a] = dims[a]
			}
		}
		vdims := make([]int, rank)
		for a := range vdims {
			vdims[a] = 1
		}
		vdims[groupAxis] = groups
		return graph.BroadcastToDims(graph.Reshape(v, vdims...), bdims...)
	}
	lo := spread(nmin)
	scale := spread(graph.MaxScalar(graph.DivScalar(graph.Sub(nmax, nmin), 255), 1e-12))
	// Stochastic rounding: floor((x - lo)/scale + u), u ~ U[0, 1), clamped to [0, 255] (values outside the running
	// range saturate instead of wrapping). Clamping first and converting after is the same: the conversion
	// truncates, which is floor on [0, 255].
	u := m.RNG.Uniform(xf.Shape())
	// Clip against scalars: ZerosLike/OnesLike bounds would be two more x-sized tensors in the forward pass.
	codes := graph.ConvertDType(graph.ClipScalar(graph.Add(graph.Div(graph.Sub(xf, lo), scale), u), 0, 255), dtypes.Uint8)
	codes = engine.SetKind(codes, engine.KindOther)
	dtype := x.DType()
	// x and its int8 copy behind one barrier (engine.Pin), every forward reader of x reading the barrier's x:
	// the quantisation must happen before anything downstream of x runs, and x can die in the forward pass.
	x2, res := engine.Pin(x, codes, scale, lo)
	rebuild := func() *graph.Node {
		// Behind a barrier tied to the reading backward function's cotangent (engine.Recompute), so that no
		// backend pulls the quantisation into the backward (recomputing the codes from x would keep x alive after
		// all) or builds the float copy early and holds it.
		f := engine.Recompute(res...)
		deq := graph.Add(graph.Mul(graph.ConvertDType(f[0], dtypes.Float32), f[1]), f[2])
		return graph.ConvertDType(deq, dtype)
	}
	if x2 == x {
		return engine.Recomputable(x, rebuild)
	}
	engine.Recomputable(x2, rebuild)
	// A backward function attached to x itself (a norm reading its own output through engine.Fresh) gets the
	// same rebuild.
	engine.Recomputable(x, func() *graph.Node { return engine.Fresh(x2) })
	return x2
}
