package finetune_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
)

// TestSettingsTable: every field of Config appears exactly once in finetune.Settings, under a key equal to its
// json tag (and its yaml tag), with help; the flag is the key with dashes; Copy and Value move that field only.
func TestSettingsTable(t *testing.T) {
	var c finetune.Config
	typ := reflect.TypeOf(c)
	base := reflect.ValueOf(&c).Pointer()
	seen := map[string]string{} // field name -> key
	for _, s := range finetune.Settings {
		ptr := reflect.ValueOf(s.Field(&c))
		var field reflect.StructField
		found := false
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			if ptr.Pointer() == base+f.Offset && ptr.Elem().Type() == f.Type {
				field, found = f, true
			}
		}
		if !found {
			t.Errorf("setting %q points at no field of Config", s.Key)
			continue
		}
		if prev, dup := seen[field.Name]; dup {
			t.Errorf("field %s appears twice, as %q and %q", field.Name, prev, s.Key)
		}
		seen[field.Name] = s.Key
		jsonKey := strings.Split(field.Tag.Get("json"), ",")[0]
		yamlKey := strings.Split(field.Tag.Get("yaml"), ",")[0]
		if s.Key != jsonKey || s.Key != yamlKey {
			t.Errorf("field %s: setting key %q, json tag %q, yaml tag %q", field.Name, s.Key, jsonKey, yamlKey)
		}
		if s.Flag() != strings.ReplaceAll(s.Key, "_", "-") || s.Help == "" {
			t.Errorf("setting %q: flag %q, help %q", s.Key, s.Flag(), s.Help)
		}
		if _, isString := s.Field(&c).(*string); (s.GPUDefault != "" || len(s.Choices) > 0) && !isString {
			t.Errorf("setting %q has a GPU default or choices but is not a string", s.Key)
		}
		if got, ok := finetune.SettingByFlag(s.Flag()); !ok || got.Key != s.Key {
			t.Errorf("SettingByFlag(%q) = %q, %v", s.Flag(), got.Key, ok)
		}
	}
	for i := 0; i < typ.NumField(); i++ {
		if _, ok := seen[typ.Field(i).Name]; !ok {
			t.Errorf("field %s of Config is missing from finetune.Settings", typ.Field(i).Name)
		}
	}
	// Copy moves exactly one field.
	src, dst := finetune.Defaults(), finetune.Defaults()
	src.LR, src.Steps, src.LoRATarget = 0.5, 7, []string{"all-linear"}
	for _, key := range []string{"lr", "lora_targets"} {
		s, _ := finetune.SettingByKey(key)
		s.Copy(&dst, &src)
	}
	if dst.LR != 0.5 || dst.Steps != finetune.Defaults().Steps || !reflect.DeepEqual(dst.LoRATarget, []string{"all-linear"}) {
		t.Errorf("Copy of lr and lora_targets gave lr %g, steps %d, targets %v", dst.LR, dst.Steps, dst.LoRATarget)
	}
	if s, _ := finetune.SettingByKey("steps"); s.Value(src) != 7 {
		t.Errorf("Value(steps) = %v", s.Value(src))
	}
}

// TestSettingsChecks: the choices and bounds of the table are what Validate reports, by key, on one line.
func TestSettingsChecks(t *testing.T) {
	for _, tc := range []struct {
		edit func(*finetune.Config)
		want string
	}{
		{func(c *finetune.Config) { c.Optimizer = "lion" }, `optimizer must be adamw or sgd, got "lion"`},
		{func(c *finetune.Config) { c.Schedule = "step" }, `schedule must be constant, linear or cosine, got "step"`},
		{func(c *finetune.Config) { c.ComputeDType = "float16" }, `compute_dtype must be float32 or bfloat16, got "float16"`},
		{func(c *finetune.Config) { c.Method = "dora" }, `method must be full, lora, lora-fa or qlora, got "dora"`},
		{func(c *finetune.Config) { c.BatchSize = 0 }, "batch_size must be positive, got 0"},
		{func(c *finetune.Config) { c.AccumSteps = -1 }, "accum_steps must be positive, got -1"},
		{func(c *finetune.Config) { c.KeepCheckpoints = -2 }, "keep_checkpoints must not be negative, got -2"},
		{func(c *finetune.Config) { c.WeightDecay = -0.1 }, "weight_decay must not be negative, got -0.1"},
		{func(c *finetune.Config) { c.DivergenceFactor = -1 }, "divergence_factor must not be negative"},
	} {
		c := finetune.Defaults()
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("error %v, want one line with %q", err, tc.want)
		}
	}
	if err := finetune.Defaults().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// TestResolve: defaults, then the file, then the flags set; GPU defaults only for what neither gave; method full
// drops the LoRA defaults unless the file or a flag gave them.
func TestResolve(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	os.WriteFile(file, []byte("method: full\nlr: 0.001\nsteps: 50\ncompute_dtype: float32\n"), 0o644)
	flags := finetune.Defaults()
	flags.Steps, flags.LR = 9, 0.5 // only steps is "set"
	cfg, err := finetune.Resolve(finetune.Sources{File: file, Flags: flags, FlagSet: func(k string) bool { return k == "steps" },
		Backend: "xla:cuda"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Method != finetune.MethodFull || cfg.LR != 0.001 || cfg.Steps != 9 || cfg.LoRARank != 0 || cfg.LoRATarget != nil {
		t.Errorf("resolved %+v", cfg)
	}
	if cfg.ComputeDType != "float32" || cfg.Attention != "flash" {
		t.Errorf("GPU defaults: compute_dtype %s (the file's float32 wins), attention %s (want flash)", cfg.ComputeDType, cfg.Attention)
	}
	// method full with an explicit lora_r is the user's contradiction, reported as one line.
	flags.Method, flags.LoRARank = finetune.MethodFull, 4
	_, err = finetune.Resolve(finetune.Sources{Flags: flags, FlagSet: func(k string) bool { return k == "method" || k == "lora_r" }})
	if err == nil || !strings.Contains(err.Error(), "takes no lora_r") {
		t.Errorf("full with --lora-r: %v", err)
	}
	// The autopilot turns MS-norm on, unless the file or a flag says otherwise.
	if cfg, err := finetune.Resolve(finetune.Sources{MSNormByDefault: true}); err != nil || !cfg.MSNorm {
		t.Errorf("autopilot: ms_norm %v (%v), want on", cfg.MSNorm, err)
	}
	if cfg, err := finetune.Resolve(finetune.Sources{MSNormByDefault: true, Flags: finetune.Defaults(), FlagSet: func(k string) bool { return k == "ms_norm" }}); err != nil || cfg.MSNorm {
		t.Errorf("autopilot with --ms-norm=false: ms_norm %v (%v)", cfg.MSNorm, err)
	}
	os.WriteFile(file, []byte("ms_norm: false\n"), 0o644)
	if cfg, err := finetune.Resolve(finetune.Sources{MSNormByDefault: true, File: file}); err != nil || cfg.MSNorm {
		t.Errorf("autopilot with ms_norm: false in the file: ms_norm %v (%v)", cfg.MSNorm, err)
	}
	if cfg, err := finetune.Resolve(finetune.Sources{}); err != nil || cfg.MSNorm {
		t.Errorf("no autopilot: ms_norm %v (%v), want the default off", cfg.MSNorm, err)
	}
	os.WriteFile(file, []byte("no_such_key: 1\n"), 0o644)
	if _, err := finetune.Resolve(finetune.Sources{File: file}); err == nil || !strings.Contains(err.Error(), "no_such_key") {
		t.Errorf("unknown key: %v", err)
	}
}
