package finetune_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/vit"
)

// TestBlockPlanTrains: a per-block plan giving every block the model-wide options trains exactly as those
// options do; a mixed plan with Mesa in one block and checkpointing in the other keeps less than plain, trains,
// and resumes exactly (its Mesa range states included); bad plans are refused by the config check.
func TestBlockPlanTrains(t *testing.T) {
	cfg := config(finetune.MethodLoRA, 4)
	cfg.TrainModules = []string{"classifier"}
	global := cfg
	global.ApproxAct = true
	model, data := imageTask(t, vit.Options{ApproxActivation: true}) // the model-wide option (LoadModel sets it from approx_act)
	want, _ := fit(t, model, data, global, 6)
	planned := cfg
	planned.BlockPlan = "approx-act*2"
	model2, _ := imageTask(t, vit.Options{})
	got, _ := fit(t, model2, data, planned, 6)
	for i := range want {
		if got[i].Loss != want[i].Loss {
			t.Fatalf("step %d: loss %v with the plan approx-act*2, %v with approx_act", i+1, got[i].Loss, want[i].Loss)
		}
	}

	mixed := cfg
	mixed.BlockPlan = "approx-act+mesa-act+mesa-norm,grad-ckpt"
	mixed.Steps = 6
	plainModel, _ := imageTask(t, vit.Options{})
	plainTr, err := finetune.New(plainModel, cfg, gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	whole, trWhole := fit(t, func() finetune.Model { m, _ := imageTask(t, vit.Options{}); return m }(), data, mixed, 6)
	loader, _ := finetune.NewLoader(data, 6, mixed.Seed, true)
	b, _ := loader.Next()
	if s, p := trWhole.SavedReport(b).Total, plainTr.SavedReport(b).Total; s >= p {
		t.Errorf("the mixed plan keeps %d bytes, plain %d", s, p)
	}
	if len(trWhole.Mesa) == 0 {
		t.Error("a plan with Mesa in a block must carry Mesa range states")
	}

	out := t.TempDir()
	m3, _ := imageTask(t, vit.Options{})
	tr, err := finetune.New(m3, mixed, gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	l1, _ := finetune.NewLoader(data, 6, mixed.Seed, true)
	ctx, cancel := context.WithCancel(context.Background())
	var stats []finetune.StepStats
	hooks := finetune.Hooks{OnStep: func(s finetune.StepStats) {
		stats = append(stats, s)
		if s.Step == 3 {
			cancel()
		}
	}}
	if err := tr.Fit(ctx, l1, out, nil, hooks); !errors.Is(err, context.Canceled) {
		t.Fatalf("first half: %v", err)
	}
	m4, _ := imageTask(t, vit.Options{})
	l2, _ := finetune.NewLoader(data, 6, mixed.Seed, true)
	tr2, err := finetune.Resume(out, m4, gtest.Backend(t), l2)
	if err != nil {
		t.Fatal(err)
	}
	hooks.OnStep = func(s finetune.StepStats) { stats = append(stats, s) }
	if err := tr2.Fit(context.Background(), l2, out, nil, hooks); err != nil {
		t.Fatal(err)
	}
	for i := range whole {
		if stats[i].Loss != whole[i].Loss {
			t.Errorf("step %d: resumed loss %v, uninterrupted %v", i+1, stats[i].Loss, whole[i].Loss)
		}
	}
	if whole[len(whole)-1].Loss >= whole[0].Loss {
		t.Errorf("the mixed plan does not train: loss %v -> %v", whole[0].Loss, whole[len(whole)-1].Loss)
	}

	for plan, msg := range map[string]string{"approx-act": "covers 1 blocks, the model has 2", "fast*2": "unknown option"} {
		bad := cfg
		bad.BlockPlan = plan
		m, _ := imageTask(t, vit.Options{})
		if _, err := finetune.New(m, bad, gtest.Backend(t)); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("plan %q: %v, want %q", plan, err, msg)
		}
	}
	both := cfg
	both.BlockPlan, both.GradCkpt = "plain*2", true
	if err := both.Validate(); err == nil || !strings.Contains(err.Error(), "leave those off") {
		t.Errorf("block_plan with grad_ckpt: %v", err)
	}
}
