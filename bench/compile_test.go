package bench_test

import (
	"errors"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"

	"github.com/memfit/memfit/bench"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/memory"
)

// TestCompileErrorHasItsCause: the block-stack step and the matmul timing fail with the backend's error when it
// refuses to compile.
func TestCompileErrorHasItsCause(t *testing.T) {
	refusing := gtest.RefusingBackend(gtest.Backend(t))
	if _, err := bench.BuildStep(refusing, bench.ViTB(1, 1), bench.Variants[0]); !errors.Is(err, gtest.ErrRefused) {
		t.Errorf("BuildStep: %v", err)
	}
	sq := shapes.Make(dtypes.Float32, 8, 8)
	op := memory.MatmulOp{LHS: sq, RHS: sq, LHSContracting: []int{1}, RHSContracting: []int{0}}
	if _, err := bench.MatmulOpSeconds(refusing, op, 1); !errors.Is(err, gtest.ErrRefused) {
		t.Errorf("MatmulOpSeconds: %v", err)
	}
}
