package plan

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/compute/shapes"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
)

// TestPlannerTrainsWhatTheTrainerTrains: for full fine-tuning, LoRA (with and without train_modules), LoRA-FA
// and QLoRA on a tiny ViT and LLaMA, the memory planner's step (built from config.json's shapes alone) has
// exactly the trainer's trainable and frozen tensors, names, shapes and dtypes, and both refuse the same bad
// train_modules with the same error.
func TestPlannerTrainsWhatTheTrainerTrains(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	dirs := map[string]string{}
	vcfg, _ := vit.Preset("tiny", 3)
	vj, _ := vcfg.JSON()
	dirs["vit"] = filepath.Join(t.TempDir(), "vit")
	lcfg, _ := llama.Preset("tiny", 0)
	lj, _ := llama.JSON(lcfg)
	dirs["llama"] = filepath.Join(t.TempDir(), "llama")
	if err := models.SaveCheckpoint(dirs["vit"], vj, vit.RandomParams(vcfg, 1), 0); err != nil {
		t.Fatal(err)
	}
	if err := models.SaveCheckpoint(dirs["llama"], lj, decoder.RandomParams(lcfg, 2), 0); err != nil {
		t.Fatal(err)
	}
	modules := map[string]string{"vit": "classifier", "llama": "model.embed_tokens"}
	quantised := map[string]string{"vit": "vit.encoder.layer.0.attention.attention.query", "llama": "model.layers.0.self_attn.q_proj"}
	for _, arch := range []string{"vit", "llama"} {
		for _, c := range []struct {
			name, method, modules string
			ms, bf16              bool
		}{
			{"full", finetune.MethodFull, "", false, false},
			{"lora", finetune.MethodLoRA, "", false, false},
			{"lora+modules+ms-norm+bf16", finetune.MethodLoRA, modules[arch], true, true},
			{"lora-fa", finetune.MethodLoRAFA, "", false, false},
			{"qlora+ms-norm", finetune.MethodQLoRA, "", true, false},
			{"qlora+modules", finetune.MethodQLoRA, modules[arch], false, false},
			{"qlora+bad-modules", finetune.MethodQLoRA, quantised[arch], false, false},
			{"lora+unknown-module", finetune.MethodLoRA, "no.such.module", false, false},
		} {
			name := arch + "/" + c.name
			cfg := finetune.Defaults()
			cfg.Method, cfg.MSNorm, cfg.LoRATarget = c.method, c.ms, []string{"all-linear"}
			if c.method == finetune.MethodFull {
				cfg.LoRARank, cfg.LoRATarget = 0, nil
			}
			if c.modules != "" {
				cfg.TrainModules = []string{c.modules}
			}
			if c.bf16 {
				cfg.ComputeDType = "bfloat16"
			}
			model, err := finetune.LoadModel(dirs[arch], cfg)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			tr, trErr := finetune.New(model, cfg, backend)
			labels := 0
			if arch == "vit" {
				labels = 3
			}
			pm, shp, err := ShapeModel(dirs[arch], cfg, labels)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			step, planErr := gradientStep(backend, pm, shp, cfg, finetune.Shape{Batch: 2, Seq: 8})
			if trErr != nil || planErr != nil {
				if trErr == nil || planErr == nil || trErr.Error() != planErr.Error() {
					t.Errorf("%s: trainer error %v, planner error %v", name, trErr, planErr)
				} else if !strings.Contains(c.name, "bad") && !strings.Contains(c.name, "unknown") {
					t.Errorf("%s: %v", name, trErr)
				}
				continue
			}
			step.Graph.Finalize()
			if strings.Contains(c.name, "bad") || strings.Contains(c.name, "unknown") {
				t.Errorf("%s: accepted", name)
			}
			same := func(what string, planned map[string]shapes.Shape, got models.Params) {
				if len(planned) != len(got) {
					t.Errorf("%s: planner %d %s tensors, trainer %d", name, len(planned), what, len(got))
				}
				for n, s := range planned {
					p, ok := got[n]
					if !ok || !p.Shape().Equal(s) && !(p.DType() != s.DType && what == "frozen" && c.bf16) {
						t.Errorf("%s: %s %q planned %s, trainer has %v", name, what, n, s, p)
					}
				}
			}
			same("trainable", step.Train, tr.Train)
			same("frozen", step.Frozen, tr.Frozen)
		}
	}
}
