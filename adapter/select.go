package adapter

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/memfit/memfit/models"
)

// shorthands maps short target names to the module-name suffixes of ViT, the decoder families and the encoders
// (BERT, RoBERTa); where a family fuses projections (Phi-3's qkv_proj and gate_up_proj) q, k and v name the fused
// qkv_proj and gate and up the fused gate_up_proj, the layers that compute them.
var shorthands = map[string][]string{
	"q":    {"attention.attention.query", "self_attn.q_proj", "self_attn.qkv_proj", "attention.self.query"},
	"k":    {"attention.attention.key", "self_attn.k_proj", "self_attn.qkv_proj", "attention.self.key"},
	"v":    {"attention.attention.value", "self_attn.v_proj", "self_attn.qkv_proj", "attention.self.value"},
	"o":    {"attention.output.dense", "self_attn.o_proj"},
	"gate": {"mlp.gate_proj", "mlp.gate_up_proj"},
	"up":   {"intermediate.dense", "mlp.up_proj", "mlp.gate_up_proj"},
	"down": {"output.dense", "mlp.down_proj"},
	"mlp":  {"intermediate.dense", "output.dense", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.gate_up_proj"},
	"attn": {"attention.attention.query", "attention.attention.key", "attention.attention.value", "attention.output.dense", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.qkv_proj", "self_attn.o_proj",
		"attention.self.query", "attention.self.key", "attention.self.value"},
	"heads": {"classifier", "score", "lm_head", "classifier.dense", "classifier.out_proj"},
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

// Targeting is PEFT's choice of the adapted layers as adapter_config.json states it, read by PEFTConfig.Targeting:
// target_modules, exclude_modules, layers_to_transform and layers_pattern. It mirrors PEFT's
// check_target_module_exists: a list names modules by their whole path or its end after a dot, a string is a
// regular expression matched against the whole path ("all-linear": every linear layer but the output head); an
// excluded module, or one inside a module of modules_to_save, is never adapted; layers_to_transform keeps, of the
// modules a list names by their end, those whose layer index (the number after one of layers_pattern, else after
// any component) it lists (a module named by its whole path is adapted whatever layers_to_transform says).
type Targeting struct {
	// Given is false when the config has no target_modules (the weights then say which layers are adapted).
	Given bool
	// Names is target_modules as a list; Regexp as a string; AllLinear for the string "all-linear".
	Names     []string
	Regexp    *regexp.Regexp
	AllLinear bool
	// ExcludeNames and ExcludeRegexp are exclude_modules as a list or a string.
	ExcludeNames  []string
	ExcludeRegexp *regexp.Regexp
	// Layers is layers_to_transform (nil: every layer); LayersPattern is layers_pattern.
	Layers        []int
	LayersPattern []string
	// ModulesToSave is modules_to_save: modules saved whole, never adapted.
	ModulesToSave []string
}

// Targeting reads the layer choice of the config (see Targeting). A bad value is an error naming its key.
func (c PEFTConfig) Targeting() (Targeting, error) {
	var t Targeting
	var err error
	switch v := c[KeyTargets].(type) {
	case nil:
	case string:
		t.Given = true
		if strings.EqualFold(v, "all-linear") {
			t.AllLinear = true
		} else if t.Regexp, err = fullRegexp(v); err != nil {
			return t, fmt.Errorf("%s %q: %w", KeyTargets, v, err)
		}
	default:
		t.Given = true
		if t.Names, err = c.Strings(KeyTargets); err != nil {
			return t, err
		}
	}
	switch v := c["exclude_modules"].(type) {
	case nil:
	case string:
		if t.ExcludeRegexp, err = fullRegexp(v); err != nil {
			return t, fmt.Errorf("exclude_modules %q: %w", v, err)
		}
	default:
		if t.ExcludeNames, err = c.Strings("exclude_modules"); err != nil {
			return t, err
		}
	}
	switch v := c["layers_to_transform"].(type) {
	case nil:
	case float64:
		t.Layers = []int{int(v)}
	case []any:
		for i, x := range v {
			f, ok := x.(float64)
			if !ok || f != float64(int(f)) || f < 0 {
				return t, fmt.Errorf("layers_to_transform[%d] is %v, want a layer index", i, x)
			}
			t.Layers = append(t.Layers, int(f))
		}
		if len(t.Layers) == 0 {
			t.Layers = nil // PEFT: an empty list means every layer
		}
	default:
		return t, fmt.Errorf("layers_to_transform is %v, want a layer index or a list of them", v)
	}
	if t.LayersPattern, err = c.Strings("layers_pattern"); err != nil {
		return t, err
	}
	if t.ModulesToSave, err = c.Strings(KeyModulesToSave); err != nil {
		return t, err
	}
	for _, m := range t.ModulesToSave {
		if _, err := regexp.Compile(m); err != nil {
			return t, fmt.Errorf("modules_to_save %q: not a regular expression memfit reads: %v", m, err)
		}
	}
	if t.Layers != nil && (t.Regexp != nil || t.AllLinear) {
		return t, fmt.Errorf("layers_to_transform goes with a list of target_modules, not the string %q (PEFT refuses it too)", c[KeyTargets])
	}
	for _, p := range t.LayersPattern {
		if _, err := regexp.Compile(p); err != nil {
			return t, fmt.Errorf("layers_pattern %q: not a regular expression memfit reads: %v", p, err)
		}
	}
	return t, nil
}

// fullRegexp compiles a PEFT module regular expression, matched against the whole module path (re.fullmatch).
func fullRegexp(expr string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(`^(?:` + expr + `)$`)
	if err != nil {
		return nil, fmt.Errorf("not a regular expression memfit reads (Go's RE2 syntax): %v", err)
	}
	return re, nil
}

// Selects reports whether layer l is adapted under t (a Targeting without target_modules selects every layer).
func (t Targeting) Selects(l models.LinearLayer) bool {
	path := l.Path
	switch {
	case t.ExcludeRegexp != nil && t.ExcludeRegexp.MatchString(path):
		return false
	case slices.ContainsFunc(t.ExcludeNames, func(n string) bool { return matchModule(path, n) }):
		return false
	case slices.ContainsFunc(t.ModulesToSave, func(m string) bool {
		// PEFT: re.match(rf"(^|.*\.){m}($|\..*)", key): the module or one inside it.
		re, err := regexp.Compile(`^(?:|.*\.)` + m + `(?:$|\..*)`)
		return err == nil && re.MatchString(path)
	}):
		return false
	case !t.Given:
		return true
	case t.AllLinear:
		return !l.Head
	case t.Regexp != nil:
		return t.Regexp.MatchString(path)
	case slices.Contains(t.Names, path):
		return true
	}
	if !slices.ContainsFunc(t.Names, func(n string) bool { return strings.HasSuffix(path, "."+n) }) {
		return false
	}
	if t.Layers == nil {
		return true
	}
	index, ok := t.layerIndex(path)
	return ok && slices.Contains(t.Layers, index)
}

// layerIndex is the layer index in path as PEFT finds it: the number after one of LayersPattern (re.match
// rf".*\.{pattern}\.(\d+)\."), else after any component.
func (t Targeting) layerIndex(path string) (int, bool) {
	patterns := t.LayersPattern
	if len(patterns) == 0 {
		patterns = []string{`[^.]*`}
	}
	for _, p := range patterns {
		re, err := regexp.Compile(`^.*\.(?:` + p + `)\.(\d+)\.`)
		if err != nil {
			continue
		}
		if m := re.FindStringSubmatch(path); m != nil {
			n, err := strconv.Atoi(m[1])
			return n, err == nil
		}
	}
	return 0, false
}

// Unmatched returns what of t names nothing in layers: target_modules names (or its regular expression) that
// match no layer, and layers_to_transform indices that no targeted layer has.
func (t Targeting) Unmatched(layers []models.LinearLayer) []string {
	var out []string
	for _, n := range t.Names {
		if !slices.ContainsFunc(layers, func(l models.LinearLayer) bool { return matchModule(l.Path, n) }) {
			out = append(out, strconv.Quote(n))
		}
	}
	if t.Regexp != nil && !slices.ContainsFunc(layers, func(l models.LinearLayer) bool { return t.Regexp.MatchString(l.Path) }) {
		out = append(out, "the regular expression "+strconv.Quote(strings.TrimSuffix(strings.TrimPrefix(t.Regexp.String(), "^(?:"), ")$")))
	}
	for _, i := range t.Layers {
		if !slices.ContainsFunc(layers, func(l models.LinearLayer) bool { j, ok := t.layerIndex(l.Path); return ok && i == j }) {
			out = append(out, fmt.Sprintf("layer %d (layers_to_transform)", i))
		}
	}
	return out
}

// LayerFilterIgnored returns the layers that target_modules names by their whole path outside the indices of
// layers_to_transform: PEFT adapts them whatever layers_to_transform says, so a config with any contradicts
// itself.
func (t Targeting) LayerFilterIgnored(layers []models.LinearLayer) []string {
	if t.Layers == nil {
		return nil
	}
	var out []string
	for _, l := range layers {
		if !slices.Contains(t.Names, l.Path) {
			continue
		}
		if i, ok := t.layerIndex(l.Path); !ok || !slices.Contains(t.Layers, i) {
			out = append(out, l.Path)
		}
	}
	return out
}

// ModuleNames returns the distinct names users target the layers by (the last one or two path components),
// sorted, for messages.
func ModuleNames(layers []models.LinearLayer) []string { return moduleNames(layers) }

// ModulesToSave reports whether the base parameter name belongs to one of PEFT's modules_to_save: a module
// whose path (any prefix of name's dotted components but the whole) ends with one of them (PEFT's
// key.endswith(target_key)).
func ModulesToSave(name string, modules []string) (string, bool) {
	parts := strings.Split(name, ".")
	for k := len(parts) - 1; k >= 1; k-- {
		prefix := strings.Join(parts[:k], ".")
		for _, m := range modules {
			if m != "" && strings.HasSuffix(prefix, m) {
				return m, true
			}
		}
	}
	return "", false
}
