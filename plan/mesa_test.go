package plan_test

import (
	"math"
	"testing"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/plan"
	"github.com/memfit/memfit/quant"
)

// TestMesaSavedBytes: the kinds Mesa covers keep a quarter of their float32 bytes (1 byte per value, plus a few
// range floats); the rest is unchanged.
func TestMesaSavedBytes(t *testing.T) {
	backend, _ := engine.NewBackend(engine.ChooseSpec("go"))
	defer backend.Finalize()
	cfg := finetune.Defaults()
	cfg.LoRATarget = []string{"all-linear"}
	plainV := finetune.Variant{Name: "plain"}
	mesaV := finetune.Variant{Name: "mesa", Mesa: []string{quant.MesaActivation, quant.MesaSoftmax}}
	rep, err := plan.Memory(backend, plan.MemoryRequest{Model: "vit-b16", Config: cfg, Labels: 10, Shape: finetune.Shape{Batch: 2}, Variants: []finetune.Variant{plainV, mesaV}})
	if err != nil {
		t.Fatal(err)
	}
	p, m := rep.Variants[0].SavedByKind, rep.Variants[1].SavedByKind
	for _, k := range []string{"activation", "attention"} {
		r := float64(m[k]) / float64(p[k])
		t.Logf("%s: %d -> %d bytes (%.4f)", k, p[k], m[k], r)
		if k == "activation" && math.Abs(r-0.25) > 0.01 {
			t.Errorf("GELU inputs under Mesa keep %.4f of their float32 bytes, want about 1/4", r)
		}
		if k == "attention" && !(r < 0.7) {
			t.Errorf("attention under Mesa (softmax) keeps %.4f of its bytes", r)
		}
	}
	if m["linear"] != p["linear"] {
		t.Errorf("linear inputs changed without the linear kind: %d -> %d", p["linear"], m["linear"])
	}
}
