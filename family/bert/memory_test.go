package bert_test

import (
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/plan"
)

// TestPaperMemory: the paper's RoBERTa setting (roberta-base shapes, LoRA r=64 on query and key, batch 32 of 128
// tokens, float32): ReGELU2 + MS-LN keeps at most 0.80x the plain step's saved activations (exact, read off the
// training graph; the paper measures -21% peak), ReGELU2 and MS-LN alone each keep less than plain, and the
// step's estimated peak falls too.
func TestPaperMemory(t *testing.T) {
	cfg := finetune.Defaults()
	cfg.LoRARank, cfg.LoRAAlpha, cfg.LoRATarget, cfg.BatchSize = 64, 128, []string{"query", "key"}, 32
	var variants []finetune.Variant
	for _, name := range []string{"plain", "approx-act", "ms-norm", "approx-act+ms-norm"} {
		v, err := finetune.VariantByName(name)
		if err != nil {
			t.Fatal(err)
		}
		variants = append(variants, v)
	}
	rep, err := plan.Memory(gtest.Backend(t), plan.MemoryRequest{Model: "roberta-base", Config: cfg,
		Shape: finetune.Shape{Batch: 32, Seq: 128}, Variants: variants})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Variants {
		t.Logf("%-20s saved %.3f GiB (x%.3f), peak %.3f GiB (x%.3f)", v.Name, float64(v.SavedActivationBytes)/(1<<30), v.SavedRatio, float64(v.PeakBytes)/(1<<30), v.PeakRatio)
	}
	both := rep.Variants[3]
	if both.SavedRatio > 0.80 || both.PeakRatio >= 1 {
		t.Errorf("ReGELU2 + MS-LN: saved activations x%.3f (want at most 0.80), peak x%.3f", both.SavedRatio, both.PeakRatio)
	}
	for _, v := range rep.Variants[1:3] {
		if v.SavedRatio >= 1 {
			t.Errorf("%s alone saves nothing: x%.3f", v.Name, v.SavedRatio)
		}
	}
	if rep.ModelType != "roberta" {
		t.Errorf("model type %q", rep.ModelType)
	}
}
