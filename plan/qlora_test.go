package plan_test

import (
	"testing"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/plan"
)

// TestQLoRAMemoryPlan: llama-1b shapes in NF4 with double quantisation take about 4.13 bits per parameter.
func TestQLoRAMemoryPlan(t *testing.T) {
	backend, _ := engine.NewBackend(engine.ChooseSpec("go"))
	defer backend.Finalize()
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRATarget, cfg.ComputeDType = finetune.MethodQLoRA, []string{"all-linear"}, "bfloat16"
	rep, err := plan.Memory(backend, plan.MemoryRequest{Model: "llama-1b", Config: cfg, Shape: finetune.Shape{Batch: 1, Seq: 64},
		Variants: []finetune.Variant{finetune.Variants[0], finetune.Variants[3]}})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Variants {
		t.Logf("%s: %.4f bits per quantised parameter (%d parameters, %d bytes), weights %d bytes", v.Name,
			v.QuantizedBits, v.QuantizedParams, v.QuantizedBytes, v.WeightsBytes)
		if v.QuantizedBits < 4.12 || v.QuantizedBits > 4.16 {
			t.Errorf("%s: %.4f bits per quantised parameter, want about 4.13", v.Name, v.QuantizedBits)
		}
	}
}
