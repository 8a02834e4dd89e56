package adapter_test

import (
	"strings"
	"testing"

	"github.com/memfit/memfit/adapter"
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
