package poolcounter_test

import (
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/bench"
	"github.com/memfit/memfit/memory"
)

// TestBlockStackAgreement runs the ViT block-stack training step of memfit's benchmark (reduced shapes, two
// layers) in all four activation/norm modes and checks that the liveness simulation shipped in memfit's binary
// agrees with the buffer-pool counter to the byte.
func TestBlockStackAgreement(t *testing.T) {
	cfg := bench.StackConfig{Layers: 2, Batch: 2, Tokens: 33, Hidden: 96, MLP: 384, Heads: 4, Steps: 1, Seed: 3}
	for _, v := range bench.Variants {
		settle()
		step, err := bench.BuildStep(backendFor(t, one1), cfg, v)
		if err != nil {
			t.Fatal(err)
		}
		var outputs []*tensors.Tensor
		measured, err := memory.MeasurePeak(step.Graph, func() (err error) {
			outputs, err = step.Execute()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outputs {
			o.MustFinalizeAll()
		}
		simulated, err := memory.SimulatePeak(step.Graph, memory.SimOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%-14s counter peak %d (resident %d), simulation %d (resident %d)", v.Name,
			measured.Bytes, measured.Resident, simulated.Bytes, simulated.Resident)
		if measured.Method != memory.MethodPoolCounter {
			t.Fatalf("%s: peak method %q, want the pool counter", v.Name, measured.Method)
		}
		if measured.Bytes != simulated.Bytes || measured.Resident != simulated.Resident {
			t.Errorf("%s: counter peak %d / resident %d, simulation %d / %d", v.Name, measured.Bytes,
				measured.Resident, simulated.Bytes, simulated.Resident)
		}
		step.Release()
	}
}
