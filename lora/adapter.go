// Package lora attaches adapters to a model's linear layers: LoRA, LoRA-FA, and any custom adapter written
// against the Adapter interface. Models never know which adapters are in use: a Set turns into the
// models.LinearHook through which every linear layer is applied.
package lora

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
)

// Adapter is a trainable modification of one linear layer. memfit's LoRA and LoRA-FA implement it; a custom
// adapter (DoRA, IA3, ...) implements it the same way and plugs into a Set without changes to memfit.
type Adapter interface {
	// Type names the adapter family, as PEFT's peft_type ("LORA", "IA3", ...).
	Type() string
	// Init returns the adapter's tensors for layer, by name suffix (PEFT style, e.g. "lora_A.weight"), freshly
	// initialised from r.
	Init(layer models.LinearLayer, r *rand.Rand) (map[string]*tensors.Tensor, error)
	// Trainable reports whether the tensor with this suffix is trained (false: frozen, like LoRA-FA's A).
	Trainable(suffix string) bool
	// Forward returns the adapted layer's output for x: base is the frozen layer (weight [Out, In], bias [Out]
	// or nil), params holds the adapter's tensors as graph nodes by suffix, and ctx says whether this is a
	// training step and gives its random-number source.
	Forward(ctx Context, layer models.LinearLayer, x, weight, bias *graph.Node, params map[string]*graph.Node) *graph.Node
	// Settings returns the adapter's fields for adapter_config.json (merged over the common keys).
	Settings() map[string]any
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
// order).
func NewSet(layers []models.LinearLayer, targets []string, newAdapter func(models.LinearLayer) Adapter, seed uint64) (*Set, error) {
	selected, err := SelectLayers(layers, targets)
	if err != nil {
		return nil, err
	}
	s := &Set{Layers: map[string]models.LinearLayer{}, Adapters: map[string]Adapter{}, Params: models.Params{}}
	r := rand.New(rand.NewPCG(seed, 0x10a))
	for _, l := range selected {
		a := newAdapter(l)
		params, err := a.Init(l, r)
		if err != nil {
			return nil, fmt.Errorf("adapter for %s: %w", l.Path, err)
		}
		s.Layers[l.Path] = l
		s.Adapters[l.Path] = a
		for suffix, t := range params {
			s.Params[l.Path+"."+suffix] = t
		}
	}
	return s, nil
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

// split splits a parameter name into its module path and suffix.
func (s *Set) split(name string) (string, string) {
	for path := range s.Layers {
		if strings.HasPrefix(name, path+".") {
			return path, name[len(path)+1:]
		}
	}
	return "", name
}

// Hook returns the models.LinearHook that applies the adapters. It reads the base layer and the adapter tensors
// from the Bound it is called with, so bind the Set's Params too and merge them into the model's Bound
// (models.Bind + Bound.Merge). Layers without an adapter get the plain engine.Linear.
func (s *Set) Hook() models.LinearHook {
	return func(b models.Bound, path string, x *graph.Node) *graph.Node {
		a, ok := s.Adapters[path]
		weight, bias := b.Weight(path), b.Nodes[path+".bias"]
		if !ok {
			return engine.Linear(x, weight, bias)
		}
		params := map[string]*graph.Node{}
		for _, suffix := range s.suffixes(path) {
			n := b.Nodes[path+"."+suffix]
			if n == nil {
				panic(fmt.Sprintf("lora: adapter tensor %s.%s is not bound", path, suffix))
			}
			params[suffix] = n
		}
		return a.Forward(Context{Training: b.Training, RNG: b.RNG}, s.Layers[path], x, weight, bias, params)
	}
}

// suffixes returns the adapter tensor suffixes of the layer at path.
func (s *Set) suffixes(path string) []string {
	var out []string
	for name := range s.Params {
		if p, suffix := s.split(name); p == path {
			out = append(out, suffix)
		}
	}
	sort.Strings(out)
	return out
}

// shorthands maps short target names to the module-name suffixes of ViT and LLaMA.
var shorthands = map[string][]string{
	"q":     {"attention.attention.query", "self_attn.q_proj"},
	"k":     {"attention.attention.key", "self_attn.k_proj"},
	"v":     {"attention.attention.value", "self_attn.v_proj"},
	"o":     {"attention.output.dense", "self_attn.o_proj"},
	"gate":  {"mlp.gate_proj"},
	"up":    {"intermediate.dense", "mlp.up_proj"},
	"down":  {"output.dense", "mlp.down_proj"},
	"mlp":   {"intermediate.dense", "output.dense", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"},
	"attn":  {"attention.attention.query", "attention.attention.key", "attention.attention.value", "attention.output.dense", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"},
	"heads": {"classifier", "score", "lm_head"},
}

// SelectLayers picks the layers named by targets, each of which is:
//
//   - "all-linear": every linear layer but the output head (as PEFT);
//   - a shorthand: q, k, v, o, gate, up, down, attn, mlp (ViT and LLaMA names), heads (the output head);
//   - a module name, matched like PEFT's target_modules: the whole path, or its last components (q_proj,
//     self_attn.q_proj, model.layers.0.self_attn.q_proj).
//
// A target that matches no layer is an error naming it and listing the model's module names.
func SelectLayers(layers []models.LinearLayer, targets []string) ([]models.LinearLayer, error) {
	if len(targets) == 0 {
		return nil, fmt.Errorf("no adapter targets given (use e.g. q,v or all-linear)")
	}
	chosen := map[string]bool{}
	for _, raw := range targets {
		target := strings.TrimSpace(raw)
		if target == "" {
			return nil, fmt.Errorf("empty adapter target in %q", strings.Join(targets, ","))
		}
		matched := false
		for _, l := range layers {
			var ok bool
			switch {
			case target == "all-linear":
				ok = !l.Head
			case shorthands[target] != nil:
				for _, suffix := range shorthands[target] {
					ok = ok || matchModule(l.Path, suffix)
				}
			default:
				ok = matchModule(l.Path, target)
			}
			if ok {
				chosen[l.Path] = true
				matched = true
			}
		}
		if !matched {
			return nil, fmt.Errorf("adapter target %q matches no linear layer of this model (module names end in: %s)",
				target, strings.Join(moduleNames(layers), ", "))
		}
	}
	var out []models.LinearLayer
	for _, l := range layers {
		if chosen[l.Path] {
			out = append(out, l)
		}
	}
	return out, nil
}

// matchModule reports whether name is path or its trailing dotted components.
func matchModule(path, name string) bool {
	return path == name || strings.HasSuffix(path, "."+name)
}

// moduleNames returns the distinct last two components of the layers' paths (the names users target).
func moduleNames(layers []models.LinearLayer) []string {
	seen := map[string]bool{}
	for _, l := range layers {
		parts := strings.Split(l.Path, ".")
		name := parts[len(parts)-1]
		if len(parts) >= 2 && !isIndex(parts[len(parts)-2]) {
			name = parts[len(parts)-2] + "." + name
		}
		seen[name] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func isIndex(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}
