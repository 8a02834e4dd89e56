package adapter

import (
	"fmt"
	"slices"
	"strings"

	"github.com/memfit/memfit/models"
)

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
