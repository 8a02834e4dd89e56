package finetune_test

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/compute/shapes"

	vitfam "github.com/memfit/memfit/family/vit"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/safetensors"
)

// toyModel is the model of a family registered by a test, as a new family's package would register one: a tiny
// ViT under its own type and model_type, "toy".
type toyModel struct{ vitfam.Model }

// registerToy registers the toy family once for the test binary.
var registerToy = func() func() {
	done := false
	return func() {
		if done {
			return
		}
		done = true
		vitFamily, _ := finetune.FamilyByName("vit")
		wrap := func(m finetune.Model, err error) (finetune.Model, error) {
			if err != nil {
				return nil, err
			}
			return toyModel{m.(vitfam.Model)}, nil
		}
		finetune.RegisterFamily(finetune.Family{
			Name: "toy", Title: "Toy",
			Of: func(m finetune.Model) bool { _, ok := m.(toyModel); return ok },
			Load: func(dir string, opts finetune.ModelOptions) (finetune.Model, error) {
				c, err := vit.Preset("tiny", 3)
				if err != nil {
					return nil, err
				}
				return wrap(vitFamily.Rebuild(vitfam.Model{Model: &vit.Model{Config: c}}, vit.RandomParams(c, 1), opts.MSNorm))
			},
			Rebuild: func(m finetune.Model, params models.Params, msNorm bool) (finetune.Model, error) {
				return wrap(vitFamily.Rebuild(m.(toyModel).Model, params, msNorm))
			},
			BatchShapes: func(m finetune.Model, in finetune.Shape) (map[string]shapes.Shape, error) {
				return vitFamily.BatchShapes(m.(toyModel).Model, in)
			},
			RandomBatch: func(m finetune.Model, in finetune.Shape, seed uint64) finetune.Batch {
				return vitFamily.RandomBatch(m.(toyModel).Model, in, seed)
			},
		})
	}
}()

// TestFamilyRegistry: the shipped families are registered and found by name, model and data format; a family
// registered from outside finetune (the toy one) loads from a folder whose config.json names it, trains through
// the recipe on safetensors data and gets random batches, with no change to finetune; a second family of a
// registered name is refused.
func TestFamilyRegistry(t *testing.T) {
	registerToy()
	for name, format := range map[string]string{"vit": finetune.FormatImageTar, "llama": finetune.FormatAlpaca} {
		f, ok := finetune.FamilyByName(name)
		if !ok || f.Name != name {
			t.Fatalf("family %s: %+v", name, f)
		}
		if fams := finetune.FamiliesOfFormat(format); !slices.ContainsFunc(fams, func(g finetune.Family) bool { return g.Name == name }) {
			t.Errorf("format %s: families %v", format, fams)
		}
	}
	model, data := imageTask(t, vit.Options{})
	if f, ok := finetune.FamilyOf(model); !ok || f.Name != "vit" || f.Sequence {
		t.Errorf("a ViT's family: %+v", f)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type": "toy"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "train.safetensors")
	if err := safetensors.WriteTensors(path, data, "", nil); err != nil {
		t.Fatal(err)
	}
	cfg := config(finetune.MethodLoRA, 2)
	cfg.BatchSize = 6
	var losses []float64
	res, err := finetune.Recipe{Spec: finetune.RunSpec{Model: dir, Data: path, Config: cfg}, Backend: gtest.Backend(t),
		Hooks: finetune.RunHooks{Hooks: finetune.Hooks{OnStep: func(s finetune.StepStats) { losses = append(losses, s.Loss) }}}}.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Trainer.Release()
	if _, ok := res.Trainer.Model.(toyModel); !ok || len(losses) != 2 || math.IsNaN(losses[1]) {
		t.Errorf("the toy run: model %T, losses %v", res.Trainer.Model, losses)
	}
	if b := finetune.RandomBatch(res.Trainer.Model, finetune.Shape{Batch: 2}, 1); b == nil || b.Size() != 2 {
		t.Errorf("a toy random batch: %v", b)
	}
	text := filepath.Join(t.TempDir(), "x.jsonl")
	if err := os.WriteFile(text, []byte(`{"instruction": "a", "output": "b"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := finetune.OpenData(text, finetune.DataOptions{}, res.Trainer.Model, dir, 2, 1); err == nil || !strings.HasPrefix(err.Error(), "alpaca data needs a ") || !strings.HasSuffix(err.Error(), "model; this model is a Toy") {
		t.Errorf("text data for a toy model: %v", err)
	}

	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "registered twice") {
			t.Errorf("a second vit family: %v", r)
		}
	}()
	finetune.RegisterFamily(finetune.Family{Name: "vit", Of: func(finetune.Model) bool { return false },
		Load:    func(string, finetune.ModelOptions) (finetune.Model, error) { return nil, nil },
		Rebuild: func(finetune.Model, models.Params, bool) (finetune.Model, error) { return nil, nil }})
}
