package finetune_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
)

// TestConfigFileErrors: every problem of a config file is one line naming the file, the line, the key, the value
// and what the key takes in words (never a Go type or struct field); YAML 1.1 booleans, a comma-separated list
// and 1e3 for a whole number are read as before.
func TestConfigFileErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"steps: 5\nlr: 0.001\nsteps: 6\n", `c.yaml:3: key "steps" is given twice (first on line 1): keep one`},
		{`{"steps": 5, "steps": 6}`, `c.yaml:1: key "steps" is given twice`},
		{"steps: ten\n", `c.yaml:1: steps: "ten" is not a whole number`},
		{"steps: 5.5\n", `c.yaml:1: steps: 5.5 is not a whole number`},
		{"steps: [1]\n", `c.yaml:1: steps: a list is not a whole number`},
		{"steps:\n", `c.yaml:1: steps has no value: give a whole number`},
		{"steps: 1e30\n", `c.yaml:1: steps: 1e30 is too large a number`},
		{"seed: -1\n", `c.yaml:1: seed: -1 is not a whole number, 0 or more`},
		{"lr: fast\n", `c.yaml:1: lr: "fast" is not a number`},
		{"lr: \"1e-3\"\n", `lr: "1e-3" is not a number (it is in quotes: write it without them)`},
		{"ms_norm: maybe\n", `c.yaml:1: ms_norm: "maybe" is not true or false`},
		{"method: {a: 1}\n", `c.yaml:1: method: a mapping is not a string`},
		{"lora_targets: {q: 1}\n", `lora_targets: a mapping is not a list of strings`},
		{"lora_targets: [q, [v]]\n", `lora_targets: item 2 is a list, not a string`},
		{"steps: 5\n---\nsteps: 6\n", `c.yaml:3: a second YAML document (after ---): a config file holds one`},
		{"lora-r: 4\n", `c.yaml:1: unknown key "lora-r": keys use underscores (lora_r)`},
		{"stpes: 4\n", `c.yaml:1: unknown key "stpes" (did you mean steps?)`},
		{"budget: 24GiB\n", `c.yaml:1: unknown key "budget"`},
		{"- steps: 5\n", `c.yaml:1: the config is a list, not a mapping of settings`},
		{"steps 5\n", `c.yaml:1: the config is "steps 5", not a mapping`},
		{"steps: 5\n  lr: 1\n", `c.yaml: line 2: mapping values are not allowed in this context`},
	} {
		_, _, err := finetune.ParseConfigFile("c.yaml", []byte(tc.yaml), finetune.Defaults())
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %v, want one line with %q", tc.yaml, err, tc.want)
			continue
		}
		for _, goish := range []string{"Go struct", "Go value", "of type", "Config.", "unmarshal", "json:"} {
			if strings.Contains(err.Error(), goish) {
				t.Errorf("%q: error %v names Go (%q)", tc.yaml, err, goish)
			}
		}
	}
	cfg, given, err := finetune.ParseConfigFile("c.yaml", []byte("---\nms_norm: yes\ngrad_ckpt: off\nlora_targets: q, v ,o\nsteps: 1e3\nlr: 1e-3\nseed: 7\n---\n"), finetune.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.MSNorm || cfg.GradCkpt || !slices.Equal(cfg.LoRATarget, []string{"q", "v", "o"}) || cfg.Steps != 1000 || cfg.LR != 1e-3 || cfg.Seed != 7 ||
		!given["ms_norm"] || given["method"] {
		t.Errorf("read %+v, given %v", cfg, given)
	}
	if cfg, given, err := finetune.ParseConfigFile("c.yaml", nil, finetune.Defaults()); err != nil || len(given) != 0 || cfg.Steps != finetune.Defaults().Steps {
		t.Errorf("an empty file: %v, %v", given, err)
	}
}
