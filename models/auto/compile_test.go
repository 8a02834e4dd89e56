package auto_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/auto"
)

func TestMain(m *testing.M) { gtest.Main(m) }

// TestCompileErrorHasItsCause: auto.Logits on a backend that refuses to compile returns the backend's error,
// not GoMLX's later "Graph not compiled yet".
func TestCompileErrorHasItsCause(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "llama")
	if err := auto.InitAs("llama", "tiny", 0, 1, dir, 1<<30, "float32"); err != nil {
		t.Fatal(err)
	}
	ids := tensors.FromFlatDataAndDimensions([]int32{1, 2, 3, 4}, 1, 4)
	_, err := auto.Logits(gtest.RefusingBackend(gtest.Backend(t)), dir, auto.Inputs{InputIDs: ids})
	if !errors.Is(err, gtest.ErrRefused) || strings.Contains(err.Error(), "not compiled") {
		t.Errorf("Logits: %v, want the backend's refusal", err)
	}
}
