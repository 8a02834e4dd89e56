package runner_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	vitfam "github.com/memfit/memfit/family/vit"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/runner"
)

// TestCompileErrorHasItsCause: on a backend that refuses to compile, Logits and a LogitsRunner fail with the
// backend's error (not GoMLX's later "Graph not compiled yet"), and the runner keeps no graph for the batch.
func TestCompileErrorHasItsCause(t *testing.T) {
	refusing := gtest.RefusingBackend(gtest.Backend(t))
	c, _ := vit.Preset("tiny", 3)
	m, err := vit.New(c, vit.RandomParams(c, 1), vit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	model := vitfam.Model{Model: m}
	batch := runner.Batch{"pixel_values": tensors.FromFlatDataAndDimensions(make([]float32, 2*3*32*32), 2, 3, 32, 32)}
	r := runner.NewLogitsRunner(refusing, model, nil, nil)
	for i := 0; i < 2; i++ { // the second call compiles again, and fails again, with the cause
		if _, err := r.Logits(batch); !errors.Is(err, gtest.ErrRefused) || strings.Contains(err.Error(), "not compiled") {
			t.Errorf("LogitsRunner call %d: %v", i+1, err)
		}
	}
	if _, err := runner.Logits(refusing, model, nil, nil, batch); !errors.Is(err, gtest.ErrRefused) {
		t.Errorf("Logits: %v", err)
	}
}
