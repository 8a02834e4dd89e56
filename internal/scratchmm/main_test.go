package scratchmm

import (
	"fmt"
	"os"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/memfit/memfit/bench"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/memory"
)

func f(d ...int) shapes.Shape { return shapes.Make(dtypes.Float32, d...) }

func TestMM(t *testing.T) {
	b, err := engine.NewBackend(os.Getenv("SPEC"))
	if err != nil {
		t.Fatal(err)
	}
	ops := []memory.MatmulOp{
		{LHS: f(544, 64), RHS: f(64, 64), LHSContracting: []int{1}, RHSContracting: []int{1}},  // x wT (transposed)
		{LHS: f(544, 64), RHS: f(64, 64), LHSContracting: []int{1}, RHSContracting: []int{0}},  // x w (non-transposed)
		{LHS: f(544, 64), RHS: f(256, 64), LHSContracting: []int{1}, RHSContracting: []int{1}}, // MLP up T
		{LHS: f(544, 64), RHS: f(64, 256), LHSContracting: []int{1}, RHSContracting: []int{0}}, // MLP up NT
		{LHS: f(544, 64), RHS: f(544, 64), LHSContracting: []int{0}, RHSContracting: []int{0}}, // dW
		{LHS: f(128, 17, 16), RHS: f(128, 17, 16), LHSContracting: []int{2}, RHSContracting: []int{2}, LHSBatch: []int{0}, RHSBatch: []int{0}}, // scores
		{LHS: f(3152, 192), RHS: f(192, 192), LHSContracting: []int{1}, RHSContracting: []int{1}},
		{LHS: f(3152, 192), RHS: f(192, 192), LHSContracting: []int{1}, RHSContracting: []int{0}},
		{LHS: f(3152, 192), RHS: f(8, 192), LHSContracting: []int{1}, RHSContracting: []int{1}},
		{LHS: f(3152, 192), RHS: f(192, 8), LHSContracting: []int{1}, RHSContracting: []int{0}},
	}
	for _, op := range ops {
		s, err := bench.MatmulOpSeconds(b, op, 20)
		if err != nil {
			t.Fatal(err)
		}
		d := op.LHS.Size() / op.LHS.Dimensions[op.LHSContracting[0]]
		n := op.RHS.Size() / op.RHS.Dimensions[op.RHSContracting[0]]
		k := op.LHS.Dimensions[op.LHSContracting[0]]
		if len(op.LHSBatch) > 0 {
			n = n / op.RHS.Dimensions[0]
		}
		fmt.Printf("%-60s %8.1f us %6.1f GFLOP/s\n", op.String(), s*1e6, 2*float64(d)*float64(n)*float64(k)/s/1e9)
	}
}
