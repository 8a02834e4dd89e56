package memory

import (
	"testing"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"

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
