// Package adapter is the contract between memfit and the adapters that fine-tune a model's linear layers
// (LoRA and LoRA-FA in package lora; DoRA, IA3 or any other written against this package): how an adapter is
// initialised, which of its tensors train, its forward, how it merges into (and out of) the base weight, how its
// tensors change when MS-norm folds the layer's input norm, and its PEFT adapter_config.json. A Set attaches
// adapters to a model's layers and turns into the models.LinearHook through which every linear layer is
// applied; export as PEFT, merged export, import and resume (package finetune) loop over a Set's adapters
// through this interface, so they work for any adapter.
package adapter

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
)

// Adapter is a trainable modification of one linear layer, the analogue of a PEFT tuner layer. Its tensors are
// named by suffix, as PEFT names them under the layer's module path ("lora_A.weight", "ia3_l", ...); a suffix
// must not be "weight" or "bias" (those are the base layer's, and PEFT's modules_to_save).
type Adapter interface {
	// Type names the adapter family, as PEFT's peft_type ("LORA", "IA3", ...).
	Type() string
	// Init returns the adapter's tensors for layer, freshly initialised from r. base gives the frozen layer's
	// weights (float32, dequantised, in the basis the layer computes in) for adapters whose initialisation
	// depends on them (DoRA's magnitude); it may fail when no weights are at hand (planning from shapes only).
	Init(layer models.LinearLayer, base Base, r *rand.Rand) (map[string]*tensors.Tensor, error)
	// Trainable reports whether the tensor with this suffix is trained (false: frozen, like LoRA-FA's A).
	Trainable(suffix string) bool
	// Forward returns the adapted layer's output for x: weight [Out, In] and bias [Out] (or nil) are the frozen
	// base layer, params the adapter's tensors as graph nodes by suffix, and ctx says whether this is a training
	// step and gives its random-number source.
	Forward(ctx Context, layer models.LinearLayer, x, weight, bias *graph.Node, params map[string]*graph.Node) *graph.Node
	// Merge returns the base layer with the adapter merged in: a plain layer computing what Forward computes
	// (without dropout), as PEFT's merge. params holds the adapter's tensors by suffix (float32).
	Merge(layer models.LinearLayer, base msnorm.Dense, params models.Params) (msnorm.Dense, error)
	// Unmerge returns the base layer from a merged one (PEFT's unmerge), or an error when the merge cannot be
	// undone from the adapter's tensors alone.
	Unmerge(layer models.LinearLayer, merged msnorm.Dense, params models.Params) (msnorm.Dense, error)
	// UnfoldInput returns the adapter's tensors for the layer reading the norm's full output u = g ∘ z + beta,
	// given tensors trained on the MS-norm-folded layer that reads z (msnorm's change of input basis); export
	// uses it. An adapter whose function cannot be written in the other basis returns an error saying so.
	UnfoldInput(layer models.LinearLayer, params models.Params, fold FoldedInput) (models.Params, error)
	// FoldInput is the inverse of UnfoldInput: tensors for the original layer, moved to the folded one (import).
	FoldInput(layer models.LinearLayer, params models.Params, fold FoldedInput) (models.Params, error)
	// PEFTConfig returns the adapter's fields of adapter_config.json: peft_type and its own settings (export
	// adds the common keys: target_modules, modules_to_save, base_model_name_or_path, task_type, ...). suffixes
	// are the tensor suffixes being exported, over all layers (an optional tensor may need a flag).
	PEFTConfig(suffixes []string) map[string]any
}

// FoldedInput is what an adapter's UnfoldInput and FoldInput know of a layer whose input norm MS-norm folded:
// the norm's affine (u = g ∘ z + beta) and the frozen base layer as the step computes it (folded, and
// dequantised under QLoRA), for adapters whose function depends on the base weight (DoRA's row norms).
type FoldedInput struct {
	Norm msnorm.NormAffine
	Base msnorm.Dense
}

// Base returns a layer's frozen weights on the host, for Adapter.Init.
type Base func() (msnorm.Dense, error)

// WeightsOf returns, for Set construction, the Base of every layer from float parameters p (weights named
// "<path>.weight", biases "<path>.bias"); nil p gives a Base that fails (no weights at hand).
func WeightsOf(p models.Params) func(models.LinearLayer) Base {
	return func(l models.LinearLayer) Base {
		return func() (msnorm.Dense, error) {
			if p == nil {
				return msnorm.Dense{}, fmt.Errorf("no weights for %s (the set is built from shapes only)", l.Path)
			}
			w, err := p.Float32s(l.Path + ".weight")
			if err != nil {
				return msnorm.Dense{}, err
			}
			d := msnorm.Dense{Out: l.Out, In: l.In, W: w}
			if _, ok := p[l.Path+".bias"]; ok {
				if d.B, err = p.Float32s(l.Path + ".bias"); err != nil {
					return msnorm.Dense{}, err
				}
			}
			return d, nil
		}
	}
}

// Context is what an adapter's Forward may need beyond its tensors.
type Context struct {
	// Training is true in training steps (dropout applies only then).
	Training bool
	// RNG is the step's random-number source (nil when none is available: no dropout).
	RNG *engine.RNG
}

// Set is a group of adapters attached to some of a model's linear layers.
type Set struct {
	// Layers are the adapted layers by module path.
	Layers map[string]models.LinearLayer
	// Adapters are the adapters by module path.
	Adapters map[string]Adapter
	// Params are all adapter tensors, named "<module path>.<suffix>" (PEFT's keys without the
	// "base_model.model." prefix).
	Params models.Params
}

// NewSet creates an adapter for every layer selected by targets (see SelectLayers) with newAdapter, and
// initialises their tensors from seed (layer by layer in path order, so the result does not depend on map
// order). base gives each adapter's Init the frozen layer (WeightsOf(model params), or WeightsOf(nil) when only
// shapes are known).
func NewSet(layers []models.LinearLayer, targets []string, newAdapter func(models.LinearLayer) Adapter, seed uint64, base func(models.LinearLayer) Base) (*Set, error) {
	selected, err := SelectLayers(layers, targets)
	if err != nil {
		return nil, err
	}
	s := &Set{Layers: map[string]models.LinearLayer{}, Adapters: map[string]Adapter{}, Params: models.Params{}}
	r := rand.New(rand.NewPCG(seed, 0x10a))
	for _, l := range selected {
		a := newAdapter(l)
		params, err := a.Init(l, base(l), r)
		if err != nil {
			return nil, fmt.Errorf("adapter for %s: %w", l.Path, err)
		}
		s.Layers[l.Path] = l
		s.Adapters[l.Path] = a
		for suffix, t := range params {
			if suffix == "weight" || suffix == "bias" {
				return nil, fmt.Errorf("adapter %s for %s names a tensor %q, the base layer's name", a.Type(), l.Path, suffix)
			}
			s.Params[l.Path+"."+suffix] = t
		}
	}
	return s, nil
}

// Paths returns the adapted layers' module paths, sorted.
func (s *Set) Paths() []string {
	out := make([]string, 0, len(s.Layers))
	for p := range s.Layers {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// LayerParams returns the adapter tensors of the layer at path by suffix, each taken from values when it holds
// the full name (the trained values) and from the Set's Params otherwise.
func (s *Set) LayerParams(path string, values models.Params) models.Params {
	out := models.Params{}
	for _, suffix := range s.suffixes(path) {
		if v, ok := values[path+"."+suffix]; ok {
			out[suffix] = v
		} else {
			out[suffix] = s.Params[path+"."+suffix]
		}
	}
	return out
}

// Trainable returns the names of the trainable adapter tensors, sorted.
func (s *Set) Trainable() []string {
	var out []string
	for name := range s.Params {
		path, suffix := s.split(name)
		if a := s.Adapters[path]; a != nil && a.Trainable(suffix) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// split splits a parameter name into its module path (the longest adapted layer path it starts with) and suffix.
// It looks the name's dot-separated prefixes up in Layers, from the longest, so its cost is the name's length,
// not the number of layers (a loop over every layer made building a 512-layer model's graph cubic in depth).
func (s *Set) split(name string) (string, string) {
	for i := len(name) - 1; i > 0; i-- {
		if name[i] != '.' {
			continue
		}
		if _, ok := s.Layers[name[:i]]; ok {
			return name[:i], name[i+1:]
		}
	}
	return "", name
}

// Hook returns the models.LinearHook that applies the adapters. It reads the base layer and the adapter tensors
// from the Bound it is called with, so bind the Set's Params too and merge them into the model's Bound
// (models.Bind + Bound.Merge). Layers without an adapter get the plain engine.Linear.
func (s *Set) Hook() models.LinearHook {
	suffixes := s.suffixIndex() // once: looking them up per layer made graph building quadratic in depth
	return func(b models.Bound, path string, x *graph.Node) *graph.Node {
		a, ok := s.Adapters[path]
		weight, bias := b.Weight(path), b.Nodes[path+".bias"]
		if !ok {
			return engine.Linear(x, weight, bias)
		}
		params := map[string]*graph.Node{}
		for _, suffix := range suffixes[path] {
			n := b.Nodes[path+"."+suffix]
			if n == nil {
				panic(fmt.Sprintf("adapter: tensor %s.%s is not bound", path, suffix))
			}
			params[suffix] = n
		}
		return a.Forward(Context{Training: b.Training, RNG: b.RNG}, s.Layers[path], x, weight, bias, params)
	}
}

// suffixes returns the adapter tensor suffixes of the layer at path, sorted.
func (s *Set) suffixes(path string) []string {
	var out []string
	for name := range s.Params {
		if !strings.HasPrefix(name, path+".") {
			continue
		}
		if p, suffix := s.split(name); p == path {
			out = append(out, suffix)
		}
	}
	sort.Strings(out)
	return out
}

// suffixIndex returns the adapter tensor suffixes of every adapted layer by path, each sorted, in one pass over
// Params.
func (s *Set) suffixIndex() map[string][]string {
	out := make(map[string][]string, len(s.Layers))
	for name := range s.Params {
		if p, suffix := s.split(name); p != "" {
			out[p] = append(out[p], suffix)
		}
	}
	for _, suffixes := range out {
		sort.Strings(suffixes)
	}
	return out
}
