package finetune_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/safetensors"
)

// recipeRun writes a tiny ViT checkpoint (3 classes) and its image task as a safetensors file, and returns a
// run spec of them: LoRA on every linear layer, steps steps of batch 6, a checkpoint every 2 steps.
func recipeRun(t *testing.T, steps int) finetune.RunSpec {
	t.Helper()
	c, _ := vit.Preset("tiny", 3)
	cj, _ := c.JSON()
	dir := filepath.Join(t.TempDir(), "vit")
	if err := models.SaveCheckpoint(dir, cj, vit.RandomParams(c, 1), 0); err != nil {
		t.Fatal(err)
	}
	_, data := imageTask(t, vit.Options{})
	path := filepath.Join(t.TempDir(), "train.safetensors")
	if err := safetensors.WriteTensors(path, data, "", nil); err != nil {
		t.Fatal(err)
	}
	cfg := config(finetune.MethodLoRA, steps)
	cfg.BatchSize, cfg.CheckpointEvery = 6, 2
	return finetune.RunSpec{Model: dir, Data: path, Config: cfg}
}

// TestRecipe: a Recipe with an output folder trains, calls its hooks in order, writes run.yaml, the metrics, its
// checkpoints and both exports; resumed with more steps it continues from its checkpoint; a second fresh run in
// the folder is a RequestError unless it overwrites; a resume to fewer steps than reached is a RequestError.
func TestRecipe(t *testing.T) {
	spec := recipeRun(t, 4)
	out := filepath.Join(t.TempDir(), "run")
	merged := filepath.Join(t.TempDir(), "merged")
	var events []string
	hooks := finetune.RunHooks{
		OnResolved: func(finetune.RunSpec) { events = append(events, "resolved") },
		OnStart:    func(*finetune.Trainer) error { events = append(events, "start"); return nil },
		Hooks: finetune.Hooks{
			OnStep:       func(s finetune.StepStats) { events = append(events, "step") },
			OnCheckpoint: func(string) { events = append(events, "checkpoint") },
		},
		OnTrained: func(*finetune.Trainer) { events = append(events, "trained") },
	}
	r := finetune.Recipe{Spec: spec, Out: out, Backend: gtest.Backend(t), Export: finetune.Export{Adapter: true, Merged: merged}, Hooks: hooks}
	res, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := "resolved start step step checkpoint step step checkpoint trained"
	if got := strings.Join(events, " "); got != want {
		t.Errorf("hooks %q, want %q", got, want)
	}
	if res.Trainer.Step != 4 || res.AdapterDir != filepath.Join(out, "adapter") || res.MergedDir != merged {
		t.Errorf("result: step %d, adapter %q, merged %q", res.Trainer.Step, res.AdapterDir, res.MergedDir)
	}
	for _, f := range []string{finetune.RunFile, finetune.MetricsFile, "checkpoint-4", "adapter/adapter_config.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("the run did not write %s: %v", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(merged, "config.json")); err != nil {
		t.Errorf("the merged export: %v", err)
	}
	res.Trainer.Release()

	// Resumed with two more steps.
	saved, err := finetune.ReadRunSpec(out)
	if err != nil {
		t.Fatal(err)
	}
	saved.Config.Steps = 6
	res, err = finetune.Recipe{Spec: saved, Out: out, Resume: true, Backend: gtest.Backend(t)}.Run(context.Background())
	if err != nil || res.Trainer.Step != 6 {
		t.Fatalf("resumed: %v", err)
	}
	res.Trainer.Release()
	lines, _ := os.ReadFile(filepath.Join(out, finetune.MetricsFile))
	if n := strings.Count(string(lines), "\n"); n != 6 {
		t.Errorf("%d metrics lines after 6 steps", n)
	}

	var request *finetune.RequestError
	if _, err := (finetune.Recipe{Spec: spec, Out: out, Backend: gtest.Backend(t)}).Run(context.Background()); !errors.As(err, &request) {
		t.Errorf("a fresh run in a run's folder: %v", err)
	}
	saved.Config.Steps = 3
	if _, err := (finetune.Recipe{Spec: saved, Out: out, Resume: true, Backend: gtest.Backend(t)}).Run(context.Background()); !errors.As(err, &request) ||
		!strings.Contains(err.Error(), "below the step the checkpoint reached (6)") {
		t.Errorf("a resume to fewer steps: %v", err)
	}
	res, err = finetune.Recipe{Spec: spec, Out: out, Overwrite: true, Backend: gtest.Backend(t)}.Run(context.Background())
	if err != nil || res.Trainer.Step != 4 {
		t.Fatalf("overwritten: %v", err)
	}
	res.Trainer.Release()
}

// TestRecipePlanAndCheck: the Planner's config is what the run trains with and records (a block plan, a smaller
// micro-batch with the data opened again at its size); a MemoryCheck's refusal stops the run before its trainer
// and leaves no output folder behind; a Planner that changes the micro-batch of data given as an Iterator is
// refused.
func TestRecipePlanAndCheck(t *testing.T) {
	spec := recipeRun(t, 2)
	out := filepath.Join(t.TempDir(), "run")
	var seen finetune.Setup
	planner := func(s finetune.Setup) (finetune.Config, error) {
		seen = s
		cfg := s.Config
		cfg.BlockPlan, cfg.BatchSize, cfg.AccumSteps = "grad-ckpt*1,approx-act*1", 3, 2
		return cfg, nil
	}
	res, err := finetune.Recipe{Spec: spec, Out: out, Backend: gtest.Backend(t), Plan: planner}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Trainer.Release()
	if seen.Model == nil || seen.Data == nil || seen.Config.BatchSize != 6 {
		t.Errorf("the planner saw %+v", seen)
	}
	if c := res.Trainer.Config; c.BlockPlan != "grad-ckpt*1,approx-act*1" || c.BatchSize != 3 || c.AccumSteps != 2 {
		t.Errorf("the run trained with %+v", c)
	}
	if saved, err := finetune.ReadRunSpec(out); err != nil || saved.Config.BlockPlan != res.Trainer.Config.BlockPlan || saved.Config.BatchSize != 3 {
		t.Errorf("run.yaml: %+v, %v", saved.Config, err)
	}

	refused := errors.New("does not fit")
	fresh := filepath.Join(t.TempDir(), "fresh")
	res, err = finetune.Recipe{Spec: spec, Out: fresh, Backend: gtest.Backend(t),
		Check: func(finetune.Setup) error { return refused }}.Run(context.Background())
	if !errors.Is(err, refused) || res.Trainer != nil {
		t.Errorf("a refused run: %v", err)
	}
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused run left its folder: %v", err)
	}

	model, data := imageTask(t, vit.Options{})
	loader, _ := finetune.NewLoader(data, 6, 1, true)
	_, err = finetune.Recipe{Spec: spec, Model: model, Data: loader, Backend: gtest.Backend(t), Plan: planner}.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "give the data as Spec.Data") {
		t.Errorf("a new micro-batch for an Iterator: %v", err)
	}
}
