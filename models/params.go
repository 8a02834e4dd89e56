// Package models holds what the model packages (models/vit, models/llama) share: parameters by Hugging Face name
// and their binding to graph parameters.
package models

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/quant"
	"github.com/memfit/memfit/safetensors"
)

// Params holds a model's tensors by their Hugging Face name ("vit.encoder.layer.0.attention.attention.query.weight").
type Params map[string]*tensors.Tensor

// Names returns the parameter names in sorted order.
func (p Params) Names() []string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Float32s returns a copy of a float32 parameter's values.
func (p Params) Float32s(name string) ([]float32, error) {
	t, ok := p[name]
	if !ok {
		return nil, fmt.Errorf("missing parameter %q", name)
	}
	if t.DType() != dtypes.Float32 {
		return nil, fmt.Errorf("parameter %q is %s, want float32", name, t.DType())
	}
	var out []float32
	err := tensors.ConstFlatData[float32](t, func(flat []float32) { out = append([]float32(nil), flat...) })
	if err != nil {
		return nil, fmt.Errorf("parameter %q: %w", name, err)
	}
	return out, nil
}

// Dims returns a parameter's dimensions, or nil when it is absent.
func (p Params) Dims(name string) []int {
	if t, ok := p[name]; ok {
		return t.Shape().Dimensions
	}
	return nil
}

// LinearHook applies the linear layer at module path (the Hugging Face module name, e.g.
// "model.layers.0.self_attn.q_proj") to x, reading the layer's weight (<path>.weight [out, in]), bias and any
// adapter tensors from b. Adapters (LoRA and custom ones) are hooks that add their branch to the base layer;
// models never know which is in use.
type LinearHook func(b Bound, path string, x *graph.Node) *graph.Node

// WeightHook supplies the weight [out, in] of the linear layer at path when it is not stored as one tensor (an
// NF4-quantised base weight, say), or nil when it has none.
type WeightHook func(b Bound, path string) *graph.Node

// Bound are a model's parameters as graph parameters: one node per name, created in sorted name order.
type Bound struct {
	// Names are the parameter names in the order their graph parameters were created (sorted).
	Names []string
	// Nodes maps each name to its graph parameter.
	Nodes map[string]*graph.Node
	// Linear, when not nil, replaces engine.Linear for every linear layer the model applies through Bound.Linear.
	Linear LinearHook
	// Weights, when not nil, supplies linear weights that are not stored as <path>.weight (see Weight).
	Weights WeightHook
	// Training is set in training steps (adapters apply dropout only then).
	Training bool
	// RNG, when set, is the step's random-number source (dropout).
	RNG *engine.RNG
	// Mesa, when set, stores the saved activations of its kinds as int8 (training steps only).
	Mesa *quant.Mesa
}

// ApplyLinear applies the linear layer at module path (weights path+".weight", optional path+".bias") to x,
// through the hook when one is set. It panics (a graph-building error) when the weight is missing.
func (b Bound) ApplyLinear(path string, x *graph.Node) *graph.Node {
	if b.Linear != nil {
		if !b.HasWeight(path) {
			panic(fmt.Sprintf("models: no weight for linear layer %q", path))
		}
		return b.Linear(b, path, x)
	}
	return engine.Linear(x, b.Weight(path), b.Nodes[path+".bias"])
}

// Keep marks x, a tensor the backward pass reads, for int8 storage when b.Mesa covers kind (see quant.Mesa);
// groupAxis is the head axis, or -1 for channel groups of the last axis. It returns x.
func (b Bound) Keep(kind string, x *graph.Node, groupAxis int) *graph.Node {
	if !b.Training || b.Mesa == nil {
		return x
	}
	return b.Mesa.Keep(kind, x, groupAxis)
}

// AttentionKeep is the attention.Mask.Keep hook of b (nil without Mesa).
func (b Bound) AttentionKeep() func(kind string, x *graph.Node, headAxis int) *graph.Node {
	if !b.Training || b.Mesa == nil {
		return nil
	}
	return b.Mesa.Keep
}

// Weight returns the weight [out, in] of the linear layer at path: the <path>.weight parameter, or what the
// Weights hook builds for it (a dequantised NF4 weight). It panics (a graph-building error) when there is none.
// Each call of a hook builds a new node, so call it once per use.
func (b Bound) Weight(path string) *graph.Node {
	if w := b.Nodes[path+".weight"]; w != nil {
		return w
	}
	if b.Weights != nil {
		if w := b.Weights(b, path); w != nil {
			return w
		}
	}
	panic(fmt.Sprintf("models: no weight for linear layer %q", path))
}

// HasWeight reports whether the linear layer at path has a weight (stored or supplied by the hook's tensors).
func (b Bound) HasWeight(path string) bool {
	return b.Nodes[path+".weight"] != nil || b.Nodes[path+".weight.nf4_codes"] != nil
}

// Merge returns a Bound holding the nodes of b and of others (their names must not collide) and b's hook.
func (b Bound) Merge(others ...Bound) Bound {
	out := Bound{Names: append([]string(nil), b.Names...), Nodes: map[string]*graph.Node{}, Linear: b.Linear,
		Weights: b.Weights, Training: b.Training, RNG: b.RNG, Mesa: b.Mesa}
	for n, v := range b.Nodes {
		out.Nodes[n] = v
	}
	for _, o := range others {
		for _, n := range o.Names {
			if _, dup := out.Nodes[n]; dup {
				panic(fmt.Sprintf("models: parameter %q bound twice", n))
			}
			out.Names = append(out.Names, n)
			out.Nodes[n] = o.Nodes[n]
		}
	}
	return out
}

// Checkpointed applies block to x with the parameters of b whose names start with prefix, recomputing the
// block in the backward pass instead of keeping its activations (gradient checkpointing, engine.Checkpoint).
// block receives a Bound over the same names (and b's hook), whose nodes it must use.
func (b Bound) Checkpointed(prefix string, x *graph.Node, block func(b Bound, x *graph.Node) *graph.Node) *graph.Node {
	return b.CheckpointedOver([]string{prefix}, x, block)
}

// CheckpointedOver is Checkpointed over the parameters whose names start with any of prefixes: a block that also
// reads a neighbour's parameters (a post-LN encoder layer under MS-LN applies the previous layer's norm affine to
// its residual stream, models/bert).
func (b Bound) CheckpointedOver(prefixes []string, x *graph.Node, block func(b Bound, x *graph.Node) *graph.Node) *graph.Node {
	var names []string
	for _, n := range b.Names {
		if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(n, p) }) {
			names = append(names, n)
		}
	}
	inputs := []*graph.Node{x}
	for _, n := range names {
		inputs = append(inputs, b.Nodes[n])
	}
	return engine.Checkpoint(func(in []*graph.Node) *graph.Node {
		// The recomputation must draw the same random numbers as the forward pass, which Checkpoint cannot
		// guarantee with a shared RNG: checkpointed blocks run without the RNG (no dropout inside them).
		sub := Bound{Names: names, Nodes: map[string]*graph.Node{}, Linear: b.Linear, Weights: b.Weights, Training: b.Training}
		for i, n := range names {
			sub.Nodes[n] = in[1+i]
		}
		return block(sub, in[0])
	}, inputs...)
}

// Bind creates one graph parameter per tensor of p (named after it, in sorted order) and returns them. Feed the
// graph with p's tensors in b.Names order (see Bound.Inputs).
func Bind(g *graph.Graph, p Params) Bound {
	b := Bound{Names: p.Names(), Nodes: make(map[string]*graph.Node, len(p))}
	for _, name := range b.Names {
		b.Nodes[name] = graph.Parameter(g, name, p[name].Shape())
	}
	return b
}

// Node returns the graph parameter of name, or nil when the model has no such parameter.
func (b Bound) Node(name string) *graph.Node { return b.Nodes[name] }

// List returns the graph parameters in b.Names order.
func (b Bound) List() []*graph.Node {
	out := make([]*graph.Node, len(b.Names))
	for i, n := range b.Names {
		out[i] = b.Nodes[n]
	}
	return out
}

// Inputs returns p's tensors in b.Names order, ready to pass to the compiled graph after any other inputs that
// were created before Bind.
func (b Bound) Inputs(p Params) []*tensors.Tensor {
	out := make([]*tensors.Tensor, len(b.Names))
	for i, n := range b.Names {
		out[i] = p[n]
	}
	return out
}

// ToBFloat16 rounds every float32 tensor of p to bfloat16 (BFloat16Tensor), in place, each float32 tensor
// dropped as soon as it is converted (so converting a large model holds one extra tensor at a time), and returns
// p. Other dtypes are left as they are. Hugging Face checkpoints are usually stored this way.
func (p Params) ToBFloat16() (Params, error) {
	for _, name := range p.Names() {
		if p[name].DType() != dtypes.Float32 {
			continue
		}
		t, err := BFloat16Tensor(p[name])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		p[name] = t
	}
	return p, nil
}

// BFloat16Tensor returns a bfloat16 copy of the float32 tensor t, each value rounded to the nearest bfloat16, ties
// to even (safetensors.F32ToBF16).
func BFloat16Tensor(t *tensors.Tensor) (*tensors.Tensor, error) {
	if t.DType() != dtypes.Float32 {
		return nil, fmt.Errorf("cannot convert %s to bfloat16", t.DType())
	}
	var flat []float32
	if err := tensors.ConstFlatData[float32](t, func(f []float32) { flat = f }); err != nil {
		return nil, err
	}
	out := tensors.FromShape(shapes.Make(dtypes.BFloat16, t.Shape().Dimensions...))
	if len(flat) == 0 {
		return out, nil
	}
	err := out.MutableBytes(func(b []byte) {
		for i, v := range flat {
			h := safetensors.F32ToBF16(v)
			b[2*i], b[2*i+1] = byte(h), byte(h>>8)
		}
	})
	return out, err
}
