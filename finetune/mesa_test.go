package finetune_test

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models/vit"
)

// TestMesaTrainingResumes: training with Mesa learns, carries its running ranges in the trainer and in
// checkpoints, and a resumed run continues exactly.
func TestMesaTrainingResumes(t *testing.T) {
	backend, _ := engine.NewBackend(engine.ChooseSpec("go"))
	defer backend.Finalize()
	model, data := imageTask(t, vit.Options{ApproxActivation: true, MSNorm: true})
	cfg := config(finetune.MethodLoRA, 6)
	cfg.LoRATarget, cfg.TrainModules, cfg.LR = []string{"all-linear"}, []string{"classifier"}, 3e-3
	cfg.Mesa = []string{"all"}
	tr, err := finetune.New(model, cfg, backend)
	if err != nil {
		t.Fatal(err)
	}
	loader, _ := finetune.NewLoader(data, cfg.BatchSize, 1, true)
	var losses []float64
	dir := filepath.Join(t.TempDir(), "ckpt")
	for i := 0; i < cfg.Steps; i++ {
		if i == 3 {
			if err := tr.Save(dir, loader); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := loader.Next()
		st, err := tr.TrainStep([]finetune.Batch{b})
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, st.Loss)
	}
	if len(tr.Mesa) == 0 {
		t.Fatal("no Mesa state")
	}
	if !(losses[len(losses)-1] < losses[0]) {
		t.Errorf("losses %v", losses)
	}
	loader2, _ := finetune.NewLoader(data, cfg.BatchSize, 1, true)
	tr2, err := finetune.Resume(dir, model, backend, loader2)
	if err != nil {
		t.Fatal(err)
	}
	for i := 3; i < cfg.Steps; i++ {
		b, _ := loader2.Next()
		st, err := tr2.TrainStep([]finetune.Batch{b})
		if err != nil {
			t.Fatal(err)
		}
		if st.Loss != losses[i] {
			t.Errorf("resumed step %d: loss %v, uninterrupted %v", i+1, st.Loss, losses[i])
		}
	}
	var a, b []float32
	tensors.MustConstFlatData[float32](tr.Mesa[0], func(f []float32) { a = append(a, f...) })
	tensors.MustConstFlatData[float32](tr2.Mesa[0], func(f []float32) { b = append(b, f...) })
	if !reflect.DeepEqual(a, b) {
		t.Error("the Mesa ranges differ after the resumed run")
	}
}
