package finetune_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/vit"
)

// TestCompileErrorHasItsCause: on a backend that refuses to compile (gtest.RefusingBackend), a training step
// and the planner's steps fail with the backend's error, not later with GoMLX's "Graph not compiled yet".
func TestCompileErrorHasItsCause(t *testing.T) {
	refusing := gtest.RefusingBackend(gtest.Backend(t))
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, gtest.ErrRefused) || strings.Contains(err.Error(), "not compiled") {
			t.Errorf("%s: %v, want the backend's refusal", what, err)
		}
	}
	model, data := imageTask(t, vit.Options{})
	tr, err := finetune.New(model, config(finetune.MethodLoRA, 1), refusing)
	if err != nil {
		t.Fatal(err)
	}
	loader, _ := finetune.NewLoader(data, 4, 1, false)
	b, _ := loader.Next()
	_, err = tr.TrainStep([]finetune.Batch{b})
	check("TrainStep", err)

	fam, _ := finetune.FamilyOf(model)
	batch, _ := fam.BatchShapes(model, finetune.Shape{Batch: 2})
	cfg := config(finetune.MethodLoRA, 1)
	s := finetune.StepShapes{Model: model, Params: finetune.ParamShapes(model, cfg), Config: cfg, Batch: batch}
	_, err = s.GradientStep(refusing)
	check("GradientStep", err)
	_, err = s.CompileDeviceStep(refusing)
	check("CompileDeviceStep", err)
	_, err = finetune.Logits(refusing, model, nil, nil, b)
	check("Logits", err)
}
