package quant

import (
	"math"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
)

// runMesa quantises x [rows, 16] (2 channel groups of 8 after ParseMesa's default of 8 groups is cut to divide
// 16) with the given state and returns the dequantised copy, the updated state and the group step sizes.
func runMesa(t *testing.T, x []float32, rows int, state []float32) (deq, next []float32) {
	t.Helper()
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	g := graph.NewGraph(backend, "mesa")
	xn := graph.Parameter(g, "x", shapes.Make(dtypes.Float32, rows, 16))
	rngState, _ := graph.RNGStateFromSeed(7)
	rn := graph.Parameter(g, "rng", rngState.Shape())
	m := NewMesa([]string{MesaActivation}, engine.NewRNG(rn))
	kept := m.Keep(MesaActivation, xn, -1)
	if len(m.In) != 1 {
		t.Fatalf("Keep made %d states, want 1", len(m.In))
	}
	// With ordering ties (the default) the forward continues from x behind the barrier that pins the codes;
	// without, from x itself.
	if pinned := kept != xn; pinned != engine.Ties() || (pinned && (kept.Type() != graph.NodeTypeSplitNode ||
		kept.Inputs()[0].Type() != graph.NodeTypeOptimizationBarrier || kept.Inputs()[0].Inputs()[0] != xn)) {
		t.Fatalf("Keep returned %s, ties %v", kept, engine.Ties())
	}
	fresh := engine.Fresh(kept)
	if fresh == xn || fresh == kept || engine.Fresh(xn) != fresh {
		t.Fatal("Fresh did not rebuild the marked node, or rebuilt x and the kept node differently")
	}
	if err := g.Compile(fresh, m.Out[0]); err != nil {
		t.Fatal(err)
	}
	outs := g.Run(tensors.FromFlatDataAndDimensions(x, rows, 16), rngState, tensors.FromFlatDataAndDimensions(state, 8, 3))
	tensors.MustConstFlatData[float32](outs[0], func(f []float32) { deq = append(deq, f...) })
	tensors.MustConstFlatData[float32](outs[1], func(f []float32) { next = append(next, f...) })
	return deq, next
}

func TestMesaInt8(t *testing.T) {
	const rows = 64
	x := make([]float32, rows*16)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)*0.37) * float64(1+i%16))
	}
	// First batch: the ranges are the batch's own (per group of 2 channels), and every value comes back within
	// one quantisation step.
	deq, next := runMesa(t, x, rows, make([]float32, 8*3))
	for gI := 0; gI < 8; gI++ {
		lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
		for r := 0; r < rows; r++ {
			for c := 2 * gI; c < 2*gI+2; c++ {
				lo, hi = min(lo, x[r*16+c]), max(hi, x[r*16+c])
			}
		}
		if next[3*gI] != lo || next[3*gI+1] != hi || next[3*gI+2] != 1 {
			t.Errorf("group %d state %v, want [%g %g 1]", gI, next[3*gI:3*gI+3], lo, hi)
		}
		step := (hi - lo) / 255
		for r := 0; r < rows; r++ {
			for c := 2 * gI; c < 2*gI+2; c++ {
				if d := math.Abs(float64(deq[r*16+c] - x[r*16+c])); d > float64(step)*1.0001 {
					t.Fatalf("value (%d, %d): %g -> %g, more than one step (%g) away", r, c, x[r*16+c], deq[r*16+c], step)
				}
			}
		}
	}
	// A running range narrower than the batch: new range = 0.9 old + 0.1 batch; values outside it clamp to its
	// ends (no wrap-around).
	state := make([]float32, 8*3)
	for gI := 0; gI < 8; gI++ {
		state[3*gI], state[3*gI+1], state[3*gI+2] = -0.5, 0.5, 1
	}
	deq, next = runMesa(t, x, rows, state)
	for gI := 0; gI < 8; gI++ {
		lo, hi := next[3*gI], next[3*gI+1]
		for r := 0; r < rows; r++ {
			for c := 2 * gI; c < 2*gI+2; c++ {
				v, d := x[r*16+c], deq[r*16+c]
				switch {
				case v > hi && math.Abs(float64(d-hi)) > 1e-5*float64(1+hi):
					t.Fatalf("%g above the range [%g, %g] came back as %g, not the top", v, lo, hi, d)
				case v < lo && math.Abs(float64(d-lo)) > 1e-5*float64(1-lo):
					t.Fatalf("%g below the range [%g, %g] came back as %g, not the bottom", v, lo, hi, d)
				case d < lo-1e-5 || d > hi+1e-5:
					t.Fatalf("dequantised %g outside [%g, %g]", d, lo, hi)
				}
			}
		}
	}
	if _, err := ParseMesa([]string{"act", "bogus"}); err == nil {
		t.Error("an unknown kind was accepted")
	}
}
