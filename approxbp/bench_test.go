package approxbp_test

import (
	"testing"

	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/approxbp"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
)

// BenchmarkActivation times forward+backward of each activation on a ViT-B MLP hidden tensor (8x197x3072).
func BenchmarkActivation(b *testing.B) {
	x := gtest.Tensor(gtest.Rand(1, 8*197*3072, 2), 8, 197, 3072)
	for _, c := range []struct {
		name string
		fn   func(*graph.Node) *graph.Node
	}{{"GELU", approxbp.GELU}, {"ReGELU2", approxbp.ReGELU2}, {"SiLU", approxbp.SiLU}, {"ReSiLU2", approxbp.ReSiLU2}} {
		b.Run(c.name, func(b *testing.B) {
			g := graph.NewGraph(gtest.Backend(b), c.name)
			p := graph.Parameter(g, "x", x.Shape())
			y := c.fn(p)
			grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(y, p)), p)
			if err := g.Compile(grads...); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res := g.Run(x)
				res[0].FinalizeAll()
			}
		})
	}
}
