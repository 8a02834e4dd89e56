package adapter_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/models"
)

// TestPEFTConfigReads: the typed getters read what JSON holds, give defaults for absent or null keys, and name
// the key of a value of the wrong type.
func TestPEFTConfigReads(t *testing.T) {
	c, err := adapter.ParsePEFTConfig([]byte(`{"peft_type": "LORA", "r": 8, "lora_alpha": 16.5, "use_rslora": true,
		"target_modules": ["q_proj", "v_proj"], "modules_to_save": null, "bias": "none", "task_type": "q_proj"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Type() != "LORA" {
		t.Errorf("Type() = %q", c.Type())
	}
	if r, err := c.Int("r", 0); r != 8 || err != nil {
		t.Errorf("Int(r) = %d, %v", r, err)
	}
	if a, err := c.Float("lora_alpha", 0); a != 16.5 || err != nil {
		t.Errorf("Float(lora_alpha) = %g, %v", a, err)
	}
	if d, err := c.Float("lora_dropout", 0.25); d != 0.25 || err != nil {
		t.Errorf("absent Float = %g, %v", d, err)
	}
	if b, err := c.Bool("use_rslora"); !b || err != nil {
		t.Errorf("Bool(use_rslora) = %v, %v", b, err)
	}
	if s, err := c.Strings("target_modules"); len(s) != 2 || s[1] != "v_proj" || err != nil {
		t.Errorf("Strings(target_modules) = %v, %v", s, err)
	}
	if s, err := c.Strings("modules_to_save"); s != nil || err != nil {
		t.Errorf("null Strings = %v, %v", s, err)
	}
	if s, err := c.Strings("task_type"); len(s) != 1 || err != nil {
		t.Errorf("a single string is a list of one: %v, %v", s, err)
	}
	for _, bad := range []func() error{
		func() error { _, err := c.Int("lora_alpha", 0); return err },
		func() error { _, err := c.Bool("bias"); return err },
		func() error { _, err := c.Float("bias", 0); return err },
	} {
		if err := bad(); err == nil {
			t.Error("a value of the wrong type must be an error")
		}
	}
	if _, err := c.Int("bias", 0); err == nil || !strings.Contains(err.Error(), "bias") {
		t.Errorf("the error must name the key: %v", err)
	}
	if _, err := adapter.ParsePEFTConfig([]byte("null")); err == nil {
		t.Error("a null config must be an error")
	}
}

// TestPatternsKeepFileOrder: rank_pattern and alpha_pattern keep the file's key order, and a layer takes the
// value of the first key that matches its path (PEFT's get_pattern_key: the whole path or its end after a dot,
// keys being regular expressions); a bad value or expression is an error naming the key.
func TestPatternsKeepFileOrder(t *testing.T) {
	c, err := adapter.ParsePEFTConfig([]byte(`{"rank_pattern": {"z.v_proj": 4, "v_proj": 8, "layers\\.[01]\\..*q_proj": 2}}`))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := c.Patterns("rank_pattern")
	if err != nil || len(ps) != 3 || ps[0].Key != "z.v_proj" || ps[1].Key != "v_proj" {
		t.Fatalf("Patterns = %v, %v; want the file's order", ps, err)
	}
	for path, want := range map[string]float64{"model.z.v_proj": 4, "model.layers.3.self_attn.v_proj": 8, "model.layers.1.self_attn.q_proj": 2} {
		if got, ok := adapter.MatchPattern(ps, path); !ok || got != want {
			t.Errorf("%s: %g, %v; want %g", path, got, ok, want)
		}
	}
	for _, path := range []string{"model.layers.3.self_attn.q_proj", "model.layers.0.self_attn.xv_proj"} {
		if got, ok := adapter.MatchPattern(ps, path); ok {
			t.Errorf("%s matched (%g): a key matches the whole path or its end after a dot", path, got)
		}
	}
	if b, err := json.Marshal(c["rank_pattern"]); err != nil || !strings.HasPrefix(string(b), `{"z.v_proj":4,"v_proj":8`) {
		t.Errorf("an Ordered object writes back in order: %s, %v", b, err)
	}
	for raw, want := range map[string]string{`{"alpha_pattern": {"q": "x"}}`: `alpha_pattern["q"]`, `{"alpha_pattern": {"(q": 2}}`: `alpha_pattern key "(q"`} {
		c, err := adapter.ParsePEFTConfig([]byte(raw))
		if err == nil {
			_, err = c.Patterns("alpha_pattern")
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %s", raw, err, want)
		}
	}
}

// TestTargetingAsPEFT: target_modules, exclude_modules, layers_to_transform, layers_pattern and modules_to_save
// choose layers as PEFT's check_target_module_exists does.
func TestTargetingAsPEFT(t *testing.T) {
	var layers []models.LinearLayer
	for i := 0; i < 3; i++ {
		for _, m := range []string{"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"} {
			layers = append(layers, models.LinearLayer{Path: fmt.Sprintf("model.layers.%d.%s", i, m)})
		}
	}
	layers = append(layers, models.LinearLayer{Path: "lm_head", Head: true})
	chosen := func(raw string) []string {
		t.Helper()
		c, err := adapter.ParsePEFTConfig([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		tg, err := c.Targeting()
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		var out []string
		for _, l := range layers {
			if tg.Selects(l) {
				out = append(out, strings.TrimPrefix(l.Path, "model.layers."))
			}
		}
		return out
	}
	for raw, want := range map[string]string{
		`{"target_modules": ["q_proj"]}`:                                                                      "0.self_attn.q_proj 1.self_attn.q_proj 2.self_attn.q_proj",
		`{"target_modules": "model\\.layers\\.[02]\\.mlp\\.down_proj"}`:                                       "0.mlp.down_proj 2.mlp.down_proj",
		`{"target_modules": "all-linear", "exclude_modules": ["v_proj", "mlp.down_proj"]}`:                    "0.self_attn.q_proj 1.self_attn.q_proj 2.self_attn.q_proj",
		`{"target_modules": ["q_proj", "down_proj"], "layers_to_transform": [1], "layers_pattern": "layers"}`: "1.self_attn.q_proj 1.mlp.down_proj",
		`{"target_modules": ["q_proj"], "layers_to_transform": 2}`:                                            "2.self_attn.q_proj",
		`{"target_modules": ["model.layers.0.self_attn.q_proj", "v_proj"], "layers_to_transform": [1]}`:       "0.self_attn.q_proj 1.self_attn.v_proj",
		`{"target_modules": ["q_proj", "lm_head"], "modules_to_save": ["lm_head"]}`:                           "0.self_attn.q_proj 1.self_attn.q_proj 2.self_attn.q_proj",
		`{"target_modules": ["q_proj"], "exclude_modules": ".*\\.1\\..*"}`:                                    "0.self_attn.q_proj 2.self_attn.q_proj",
	} {
		if got := strings.Join(chosen(raw), " "); got != want {
			t.Errorf("%s: chose %q, want %q", raw, got, want)
		}
	}
	c, _ := adapter.ParsePEFTConfig([]byte(`{"target_modules": ["q_proj", "foo", "model.layers.0.self_attn.v_proj"], "layers_to_transform": [0, 7]}`))
	tg, _ := c.Targeting()
	if got := fmt.Sprint(tg.Unmatched(layers)); got != `["foo" layer 7 (layers_to_transform)]` {
		t.Errorf("Unmatched = %s", got)
	}
	c, _ = adapter.ParsePEFTConfig([]byte(`{"target_modules": ["model.layers.2.self_attn.q_proj", "v_proj"], "layers_to_transform": [0]}`))
	tg, _ = c.Targeting()
	if got := tg.LayerFilterIgnored(layers); len(got) != 1 || got[0] != "model.layers.2.self_attn.q_proj" {
		t.Errorf("LayerFilterIgnored = %v", got)
	}
	for raw, want := range map[string]string{
		`{"target_modules": "(q"}`:                                     "target_modules",
		`{"target_modules": "q_proj", "layers_to_transform": [0]}`:     "layers_to_transform",
		`{"target_modules": ["q_proj"], "layers_to_transform": ["a"]}`: "layers_to_transform[0]",
		`{"exclude_modules": 3}`:                                       "exclude_modules",
	} {
		c, _ := adapter.ParsePEFTConfig([]byte(raw))
		if _, err := c.Targeting(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %s", raw, err, want)
		}
	}
}
