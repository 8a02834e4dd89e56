package ordertest_test

import (
	_ "github.com/memfit/memfit/family/all" // the families the presets name
	"testing"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/internal/ordertest"
	"github.com/memfit/memfit/memory"
)

// The families checked here by their small presets: ViT (classification head) and LLaMA (causal LM).
var families = []struct {
	model  string
	labels int
	shape  finetune.Shape
}{
	{"vit:tiny", 10, finetune.Shape{Batch: 2}},
	{"llama:tiny", 0, finetune.Shape{Batch: 2, Seq: 16}},
}

func base() finetune.Config {
	c := finetune.Defaults()
	c.LoRATarget = []string{"all-linear"}
	return c
}

// TestOrderIsData: in every memory mode, the ViT's and LLaMA's training steps order their savings by data
// dependences (memory.CheckOrder), on the graph XLA would get and on the pure-Go backend's.
func TestOrderIsData(t *testing.T) {
	for _, f := range families {
		t.Run(f.model, func(t *testing.T) {
			ordertest.Family(t, gtest.Backend(t), f.model, f.labels, base(), f.shape)
		})
	}
}

// TestTiesChangeNothingOnGo: the ties cost the pure-Go backend nothing: same saved activations, same simulated
// peak, bit-identical results, in every mode.
func TestTiesChangeNothingOnGo(t *testing.T) {
	for _, f := range families {
		t.Run(f.model, func(t *testing.T) {
			ordertest.GoUnchanged(t, gtest.Backend(t), f.model, f.labels, base(), f.shape)
		})
	}
}

// TestUntiedGraphsFail: without the ties (memfit up to issue 35), the check finds what XLA was free to undo:
// recomputations computable in the forward pass (checkpointed blocks, the memory-efficient attention, QLoRA's
// dequantised weights, LLaMA's rebuilt gated product), untied backward barriers and unpinned codes.
func TestUntiedGraphsFail(t *testing.T) {
	t.Setenv(engine.TiesEnv, "0")
	xla := ordertest.XLAShaped(gtest.Backend(t))
	for _, c := range []struct {
		model, mode string
		labels      int
		shape       finetune.Shape
		rules       []string
	}{
		{"llama:tiny", "grad-ckpt", 0, finetune.Shape{Batch: 2, Seq: 16}, []string{memory.RuleHoistable, memory.RuleUntied}},
		{"llama:tiny", "approx-act", 0, finetune.Shape{Batch: 2, Seq: 16}, []string{memory.RuleUnpinned, memory.RuleHoistable}},
		{"llama:tiny", "approx-act+mesa", 0, finetune.Shape{Batch: 2, Seq: 16}, []string{memory.RuleUnpinned, memory.RuleHoistable, memory.RuleUntied}},
		{"llama:tiny", "memory-efficient", 0, finetune.Shape{Batch: 2, Seq: 16}, []string{memory.RuleHoistable, memory.RuleUntied}},
		{"llama:tiny", "qlora", 0, finetune.Shape{Batch: 2, Seq: 16}, []string{memory.RuleHoistable, memory.RuleUntied}},
		{"vit:tiny", "approx-act+ms-norm", 10, finetune.Shape{Batch: 2}, []string{memory.RuleUnpinned}},
		{"vit:tiny", "grad-ckpt", 10, finetune.Shape{Batch: 2}, []string{memory.RuleHoistable, memory.RuleUntied}},
	} {
		var mode ordertest.Mode
		for _, m := range ordertest.Modes() {
			if m.Name == c.mode {
				mode = m
			}
		}
		rep, err := ordertest.Check(xla, c.model, c.labels, mode.Apply(base()), c.shape)
		if err != nil {
			t.Fatalf("%s %s: %v", c.model, c.mode, err)
		}
		for _, rule := range c.rules {
			if rep.Count(rule) == 0 {
				t.Errorf("%s %s without ties: no %s violation found (%d violations)", c.model, c.mode, rule, len(rep.Violations))
			}
		}
	}
}
