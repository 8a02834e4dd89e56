package plan_test

import (
	"errors"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/plan"
)

// TestCompileErrorHasItsCause: a plan on a backend that refuses to compile fails with the backend's error instead
// of reading figures off a graph that was never compiled.
func TestCompileErrorHasItsCause(t *testing.T) {
	cfg := finetune.Defaults()
	model, shp, err := plan.ShapeModel("llama:tiny", cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = plan.Step(gtest.RefusingBackend(gtest.Backend(t)), model, shp, cfg, finetune.Shape{Batch: 1, Seq: 8})
	if !errors.Is(err, gtest.ErrRefused) {
		t.Errorf("Step: %v, want the backend's refusal", err)
	}
}
