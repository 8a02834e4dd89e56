package memory

import (
	"fmt"
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
	if err := g.Compile(y); err != nil {
		t.Fatal(err)
	}
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
	if err := g.Compile(y1, y2, y3); err != nil {
		t.Fatal(err)
	}
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

// MatmulOps describes the executor's own normalised product: a DotGeneral whose operands the Go backend's builder
// transposes ([6,4]·[6,5] contracted on axis 0) is reported on the transposed operands ([4,6] and [5,6],
// contracted on axis 1), and rebuilding it with graph.DotGeneral reproduces exactly that product, with no
// Transpose.
func TestMatmulOpsNormalised(t *testing.T) {
	g := compileGraph(t, "", []shapes.Shape{f32(6, 4), f32(6, 5)}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.DotGeneral(p[0], []int{0}, nil, p[1], []int{0}, nil)}
	})
	if got := execOps(mustRead(t, g)); got != "Parameter Parameter Transpose Transpose DotGeneral" {
		t.Fatalf("executor nodes %q", got)
	}
	ops, err := MatmulOps(g)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 1 || !ops[0].LHS.Equal(f32(4, 6)) || !ops[0].RHS.Equal(f32(5, 6)) ||
		fmt.Sprint(ops[0].LHSContracting, ops[0].RHSContracting, ops[0].LHSBatch, ops[0].RHSBatch) != "[1] [1] [] []" ||
		ops[0].FLOPs != 2*4*5*6 || ops[0].Count != 1 {
		t.Fatalf("ops %v", ops)
	}
	op := ops[0]
	g2 := compileGraph(t, "", []shapes.Shape{op.LHS, op.RHS}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.DotGeneral(p[0], op.LHSContracting, op.LHSBatch, p[1], op.RHSContracting, op.RHSBatch)}
	})
	if got := execOps(mustRead(t, g2)); got != "Parameter Parameter DotGeneral" {
		t.Errorf("rebuilt product's executor nodes %q, want no Transpose", got)
	}
	ops2, err := MatmulOps(g2)
	if err != nil || len(ops2) != 1 || fmt.Sprint(ops2[0]) != fmt.Sprint(op) || ops2[0].FLOPs != op.FLOPs {
		t.Errorf("rebuilt product %v (%v), want %v", ops2, err, op)
	}
}
