package adapter

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/memfit/memfit/models"
)

// PEFTConfig is a parsed adapter_config.json, as PEFT writes it.
type PEFTConfig map[string]any

// ParsePEFTConfig parses adapter_config.json.
func ParsePEFTConfig(data []byte) (PEFTConfig, error) {
	var c PEFTConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("adapter config is null, want an object")
	}
	return c, nil
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
	return Format{}, fmt.Errorf("no adapter format reads peft_type %q with these settings (registered: %s; a custom adapter registers its format with adapter.Register)",
		cfg.Type(), strings.Join(names, ", "))
}
