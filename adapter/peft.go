package adapter

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/memfit/memfit/models"
)

// PEFTConfig is a parsed adapter_config.json, as PEFT writes it.
type PEFTConfig map[string]any

// ParsePEFTConfig parses adapter_config.json. The objects of PatternKeys keep their keys' order (as Ordered):
// PEFT gives a layer the value of the first key that matches it.
func ParsePEFTConfig(data []byte) (PEFTConfig, error) {
	var c PEFTConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("adapter config is null, want an object")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	for _, key := range PatternKeys {
		if _, ok := c[key].(map[string]any); !ok {
			continue
		}
		o, err := parseOrdered(raw[key])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		c[key] = o
	}
	return c, nil
}

// PatternKeys are the keys of adapter_config.json whose objects map module names or regular expressions to
// per-layer values, first match first (PEFT's rank_pattern and alpha_pattern).
var PatternKeys = []string{"rank_pattern", "alpha_pattern"}

// Ordered is a JSON object with its keys in the order of the file.
type Ordered []KeyValue

// KeyValue is one member of an Ordered object.
type KeyValue struct {
	Key   string
	Value any
}

// MarshalJSON writes o as a JSON object, keys in order.
func (o Ordered) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, kv := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(kv.Key)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(kv.Value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// parseOrdered reads a JSON object's members in order (values as encoding/json decodes them into any).
func parseOrdered(data []byte) (Ordered, error) {
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("want an object")
	}
	var out Ordered
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := t.(string)
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, KeyValue{key, v})
	}
	return out, nil
}

// Pattern is one entry of a per-layer pattern (rank_pattern, alpha_pattern): layers whose module path matches
// Key get Value.
type Pattern struct {
	Key   string
	Value float64
}

// Patterns returns the pattern object at key in order (an Ordered value as ParsePEFTConfig stores it; a plain
// map, as a config built in Go holds it, in sorted key order), nil when absent, null or empty. A value that is
// not a number, or a key that is not a regular expression Go reads, is an error naming both.
func (c PEFTConfig) Patterns(key string) ([]Pattern, error) {
	var members Ordered
	switch v := c[key].(type) {
	case nil:
		return nil, nil
	case Ordered:
		members = v
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			members = append(members, KeyValue{k, v[k]})
		}
	case []Pattern:
		return v, nil
	default:
		return nil, fmt.Errorf("%s is %v, want an object of module names to numbers", key, c[key])
	}
	var out []Pattern
	for _, kv := range members {
		x, ok := kv.Value.(float64)
		if !ok {
			if i, isInt := kv.Value.(int); isInt {
				x, ok = float64(i), true
			}
		}
		if !ok {
			return nil, fmt.Errorf("%s[%q] is %v, want a number", key, kv.Key, kv.Value)
		}
		if _, err := patternRegexp(kv.Key); err != nil {
			return nil, fmt.Errorf("%s key %q: %w", key, kv.Key, err)
		}
		out = append(out, Pattern{kv.Key, x})
	}
	return out, nil
}

// PatternsJSON is the pattern list as adapter_config.json holds it (an object in order; nil for none).
func PatternsJSON(ps []Pattern) any {
	if len(ps) == 0 {
		return map[string]any{}
	}
	o := make(Ordered, len(ps))
	for i, p := range ps {
		o[i] = KeyValue{p.Key, p.Value}
	}
	return o
}

var (
	patternMu    sync.Mutex
	patternCache = map[string]*regexp.Regexp{}
)

// patternRegexp compiles a pattern key as PEFT matches it (get_pattern_key: re.match(rf"(.*\.)?({key})$", path)).
func patternRegexp(key string) (*regexp.Regexp, error) {
	patternMu.Lock()
	defer patternMu.Unlock()
	if re, ok := patternCache[key]; ok {
		return re, nil
	}
	re, err := regexp.Compile(`^(?:.*\.)?(?:` + key + `)$`)
	if err != nil {
		return nil, fmt.Errorf("not a regular expression memfit reads (Go's RE2 syntax): %v", err)
	}
	patternCache[key] = re
	return re, nil
}

// MatchPattern returns the value of the first pattern that matches the module path (PEFT's get_pattern_key: the
// key, a name or regular expression, matches the whole path or its end after a dot), and whether one did.
func MatchPattern(ps []Pattern, path string) (float64, bool) {
	for _, p := range ps {
		if re, err := patternRegexp(p.Key); err == nil && re.MatchString(path) {
			return p.Value, true
		}
	}
	return 0, false
}

// Type returns peft_type ("" when absent).
func (c PEFTConfig) Type() string { s, _ := c[KeyType].(string); return s }

// Bool returns the boolean key (false when absent or null), or an error naming it when it is not a boolean.
func (c PEFTConfig) Bool(key string) (bool, error) {
	switch v := c[key].(type) {
	case nil:
		return false, nil
	case bool:
		return v, nil
	}
	return false, fmt.Errorf("%s is %v, want true or false", key, c[key])
}

// Refuse returns an error naming the first of the boolean keys that is true: settings an adapter does not
// implement (what names the adapter in the message).
func (c PEFTConfig) Refuse(what string, keys ...string) error {
	for _, key := range keys {
		on, err := c.Bool(key)
		if err != nil {
			return err
		}
		if on {
			return fmt.Errorf("%s is true: %s does not implement it", key, what)
		}
	}
	return nil
}

// Float returns the number at key, def when absent or null.
func (c PEFTConfig) Float(key string, def float64) (float64, error) {
	switch v := c[key].(type) {
	case nil:
		return def, nil
	case float64:
		return v, nil
	case int:
		return float64(v), nil
	}
	return 0, fmt.Errorf("%s is %v, want a number", key, c[key])
}

// Int returns the integer at key, def when absent or null.
func (c PEFTConfig) Int(key string, def int) (int, error) {
	f, err := c.Float(key, float64(def))
	if err != nil {
		return 0, err
	}
	if f != math.Trunc(f) || math.Abs(f) > 1<<31 {
		return 0, fmt.Errorf("%s is %v, want an integer", key, f)
	}
	return int(f), nil
}

// Strings returns the list of strings at key (nil when absent or null; a single string is a list of one).
func (c PEFTConfig) Strings(key string) ([]string, error) {
	switch v := c[key].(type) {
	case nil:
		return nil, nil
	case string:
		return []string{v}, nil
	case []any:
		out := make([]string, len(v))
		for i, x := range v {
			s, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("%s[%d] is %v, want a string", key, i, x)
			}
			out[i] = s
		}
		return out, nil
	case []string:
		return v, nil
	}
	return nil, fmt.Errorf("%s is %v, want a list of strings", key, c[key])
}

// Keys of adapter_config.json that memfit reads or writes for every adapter type.
const (
	KeyType          = "peft_type"
	KeyTargets       = "target_modules"
	KeyModulesToSave = "modules_to_save"
	KeyBaseModel     = "base_model_name_or_path"
	KeyTaskType      = "task_type"
)

// Format reads one kind of PEFT adapter: Match says whether an adapter_config.json is of this kind, New returns
// the constructor of adapters with its settings. Package lora registers LoRA (and LoRA-FA, which PEFT saves as
// LoRA); a custom adapter registers its own (see docs/adapters.md).
type Format struct {
	// Name is the format's name in messages ("LoRA", "DoRA", "IA3").
	Name string
	// Match reports whether this format reads cfg.
	Match func(cfg PEFTConfig) bool
	// New returns the adapter constructor for cfg's settings, or an error naming a bad or unsupported setting.
	New func(cfg PEFTConfig) (func(models.LinearLayer) Adapter, error)
	// Selector says, for messages, what in adapter_config.json chooses this format ("peft_type LORA with
	// use_dora true"); empty: the name says it.
	Selector string
}

// Chosen describes, for messages, why a config was read with this format.
func (f Format) Chosen() string {
	if f.Selector == "" {
		return f.Name + " adapter"
	}
	return f.Name + " adapter: " + f.Selector
}

// NewFormat returns the Format named name for the configs match accepts: read parses and checks a config's
// settings (refusing the ones the adapter does not implement, by key) and newAdapters makes the adapter
// constructor from them.
func NewFormat[C any](name string, match func(PEFTConfig) bool, read func(PEFTConfig) (C, error),
	newAdapters func(C) (func(models.LinearLayer) Adapter, error)) Format {
	return Format{Name: name, Match: match, New: func(c PEFTConfig) (func(models.LinearLayer) Adapter, error) {
		settings, err := read(c)
		if err != nil {
			return nil, err
		}
		return newAdapters(settings)
	}}
}

var (
	formatsMu sync.Mutex
	formats   []Format
)

// Register adds a format for import (finetune.ImportAdapter). Formats are tried in the order registered.
func Register(f Format) {
	formatsMu.Lock()
	defer formatsMu.Unlock()
	formats = append(formats, f)
}

// FormatOf returns the first registered format that reads cfg, or an error listing the registered ones.
func FormatOf(cfg PEFTConfig) (Format, error) {
	formatsMu.Lock()
	defer formatsMu.Unlock()
	var names []string
	for _, f := range formats {
		if f.Match(cfg) {
			return f, nil
		}
		names = append(names, f.Name)
	}
	slices.Sort(names)
	if dora, _ := cfg.Bool("use_dora"); dora && cfg.Type() == "LORA" {
		return Format{}, fmt.Errorf("use_dora is true (a DoRA adapter) and no registered format reads DoRA adapters (registered: %s; import github.com/memfit/memfit/examples/dora to register one)",
			strings.Join(names, ", "))
	}
	return Format{}, fmt.Errorf("no adapter format reads peft_type %q with these settings (registered: %s; a custom adapter registers its format with adapter.Register)",
		cfg.Type(), strings.Join(names, ", "))
}
