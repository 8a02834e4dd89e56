package memory

import (
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// A [3, 40, 50] x [3, 50, 20] batched product is 2*3*40*20*50 = 240,000 FLOPs; an unused product costs nothing.
func TestMatmulFLOPs(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	g := graph.NewGraph(backend, "flops")
	a := graph.Parameter(g, "a", shapes.Make(dtypes.Float32, 3, 40, 50))
	b := graph.Parameter(g, "b", shapes.Make(dtypes.Float32, 3, 50, 20))
	y := graph.DotGeneral(a, []int{2}, []int{0}, b, []int{1}, []int{0})
	_ = graph.DotGeneral(a, []int{2}, []int{0}, a, []int{2}, []int{0}) // not an output
	g.Compile(y)
	f, err := MatmulFLOPs(g)
	if err != nil {
		t.Fatal(err)
	}
	if f != 240000 {
		t.Errorf("%d FLOPs, want 240000", f)
	}
}

// MatmulOps groups equal products: two [4,6]x[5,6] products and one [4,6]x[6,3] one, each with its FLOPs.
func TestMatmulOps(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	g := graph.NewGraph(backend, "ops")
	a := graph.Parameter(g, "a", shapes.Make(dtypes.Float32, 4, 6))
	b := graph.Parameter(g, "b", shapes.Make(dtypes.Float32, 5, 6))
	c := graph.Parameter(g, "c", shapes.Make(dtypes.Float32, 6, 3))
	y1 := graph.DotGeneral(a, []int{1}, nil, b, []int{1}, nil)
	y2 := graph.DotGeneral(graph.Neg(a), []int{1}, nil, b, []int{1}, nil)
	y3 := graph.DotGeneral(a, []int{1}, nil, c, []int{0}, nil)
	g.Compile(y1, y2, y3)
	ops, err := MatmulOps(g)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 {
		t.Fatalf("%d distinct products, want 2: %v", len(ops), ops)
	}
	if ops[0].Count != 2 || ops[0].FLOPs != 2*4*5*6 || !ops[0].RHS.Equal(shapes.Make(dtypes.Float32, 5, 6)) {
		t.Errorf("first product %v, FLOPs %d", ops[0], ops[0].FLOPs)
	}
	if ops[1].Count != 1 || ops[1].FLOPs != 2*4*3*6 || ops[1].RHSContracting[0] != 0 {
		t.Errorf("second product %v, FLOPs %d", ops[1], ops[1].FLOPs)
	}
	if f, _ := MatmulFLOPs(g); f != 2*(2*4*5*6)+2*4*3*6 {
		t.Errorf("MatmulFLOPs %d", f)
	}
}
