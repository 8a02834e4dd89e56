package engine_test

import (
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
)

// TestVJPRegistrationIsGoMLXs: importing engine leaves GoMLX's global gradient table alone. This test's package
// imports engine, so engine's initialisation has run before the test; every function in graph.VJPRegistration is
// still one of GoMLX's own (engine up to issue 29 replaced each with a wrapper of its own package, and added one
// for every node type GoMLX has none for).
func TestVJPRegistrationIsGoMLXs(t *testing.T) {
	if len(graph.VJPRegistration) == 0 {
		t.Fatal("graph.VJPRegistration is empty")
	}
	for nodeType, fn := range graph.VJPRegistration {
		f := runtime.FuncForPC(reflect.ValueOf(fn).Pointer())
		if f == nil {
			t.Errorf("%s: gradient function with no name", nodeType)
			continue
		}
		if name := f.Name(); !strings.HasPrefix(name, "github.com/gomlx/gomlx/core/graph.") {
			t.Errorf("%s: gradient function %s is not GoMLX's", nodeType, name)
		}
	}
}

// plainGraph builds a GoMLX-only computation (no engine builder) that exercises what graph.Gradient does:
// broadcasting, a node read twice (accumulated gradients), a stop-gradient, a multi-output node with one output
// unused (its gradient filled with zeros), a dtype round trip and a parameter the loss does not depend on.
func plainGraph(p []*graph.Node) (loss *graph.Node, wrt []*graph.Node) {
	x, w, b, unused := p[0], p[1], p[2], p[3]
	h := graph.Tanh(graph.Add(graph.MatMul(x, w), graph.InsertAxes(b, 0)))
	h = graph.Add(graph.Mul(h, h), graph.Exp(h))
	h = graph.Sub(h, graph.StopGradient(graph.ReduceAndKeep(h, graph.ReduceMax, -1)))
	barred := graph.OptimizationBarriers(h, x)
	y := graph.Where(graph.GreaterThan(barred[0], graph.ScalarZero(h.Graph(), h.DType())), barred[0], graph.MulScalar(barred[0], 0.1))
	y = graph.ConvertDType(graph.Sin(graph.ConvertDType(y, dtypes.Float64)), x.DType())
	return graph.ReduceAllSum(graph.Mul(y, y)), []*graph.Node{x, w, b, unused}
}

// TestGradientIsGoMLXsOnPlainGraphs: on a graph memfit did not build, engine.Gradient builds exactly the backward
// graph.Gradient builds (node for node, with GoMLX's gradient functions), and the gradients are bit-identical.
func TestGradientIsGoMLXsOnPlainGraphs(t *testing.T) {
	x := gtest.Tensor(gtest.Rand(1, 3*4, 1), 3, 4)
	w := gtest.Tensor(gtest.Rand(2, 4*5, 1), 4, 5)
	b := gtest.Tensor(gtest.Rand(3, 5, 1), 5)
	u := gtest.Tensor(gtest.Rand(4, 2, 1), 2)
	run := func(gradient func(*graph.Node, ...*graph.Node) []*graph.Node) ([][]float32, string) {
		var desc string
		out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			loss, wrt := plainGraph(p)
			grads := gradient(loss, wrt...)
			desc = g.String()
			return append([]*graph.Node{loss}, grads...)
		}, x, w, b, u)
		return out, desc
	}
	want, wantDesc := run(graph.Gradient)
	got, gotDesc := run(engine.Gradient)
	if gotDesc != wantDesc {
		t.Errorf("engine.Gradient built another graph than graph.Gradient:\n%s\n\ngraph.Gradient:\n%s", gotDesc, wantDesc)
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("output %d: engine.Gradient %v, graph.Gradient %v", i, got[i], want[i])
		}
	}
	if !strings.Contains(wantDesc, "SplitNode") {
		t.Error("the test graph has no multi-output node")
	}
	for _, v := range want[4] {
		if v != 0 {
			t.Errorf("gradient of the unused parameter %v, want zeros", want[4])
			break
		}
	}
}

// TestGraphGradientIgnoresMemfitVJPs: GoMLX's own graph.Gradient, even on a graph memfit built, uses GoMLX's
// gradients: a VJP set with SetVJP applies through engine.Gradient only.
func TestGraphGradientIgnoresMemfitVJPs(t *testing.T) {
	x := gtest.Tensor([]float32{1, 2, 3}, 3)
	build := func(gradient func(*graph.Node, ...*graph.Node) []*graph.Node) func(*graph.Graph, []*graph.Node) []*graph.Node {
		return func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := engine.SetVJP(graph.Mul(p[0], p[0]), engine.KindActivation, func(node, v *graph.Node) []*graph.Node {
				return []*graph.Node{graph.MulScalar(v, 10), nil}
			})
			return gradient(graph.ReduceAllSum(y), p[0])
		}
	}
	plain := gtest.Run(t, build(graph.Gradient), x)
	custom := gtest.Run(t, build(engine.Gradient), x)
	for i, xv := range []float32{1, 2, 3} {
		if plain[0][i] != 2*xv {
			t.Errorf("graph.Gradient: d(x²)/dx[%d] = %v, want GoMLX's %v", i, plain[0][i], 2*xv)
		}
		if custom[0][i] != 10 {
			t.Errorf("engine.Gradient: d(x²)/dx[%d] = %v, want the custom VJP's 10", i, custom[0][i])
		}
	}
}

// TestFusedAlternateIsRefused: a GoMLX fused op whose gradient GoMLX takes from a decomposed alternate (here
// graph.Softmax with the backend's fused softmax) cannot be differentiated by engine.Gradient, which says why
// and what to do; with GOMLX_FUSION=0 the same graph differentiates like graph.Gradient.
func TestFusedAlternateIsRefused(t *testing.T) {
	x := gtest.Tensor(gtest.Rand(5, 4*6, 1), 4, 6)
	build := func(gradient func(*graph.Node, ...*graph.Node) []*graph.Node) func(*graph.Graph, []*graph.Node) []*graph.Node {
		return func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := graph.Softmax(p[0], -1)
			return gradient(graph.ReduceAllSum(graph.Mul(y, graph.Sin(p[0]))), p[0])
		}
	}
	t.Run("fused", func(t *testing.T) {
		err := engine.Try(func() {
			g := graph.NewGraph(gtest.Backend(t), t.Name())
			p := graph.Parameter(g, "x", x.Shape())
			if !engine.Fused(p, compute.OpTypeFusedSoftmax) {
				t.Skip("the backend has no fused softmax")
			}
			build(engine.Gradient)(g, []*graph.Node{p})
		})
		if err == nil || !strings.Contains(err.Error(), "FusedSoftmax") || !strings.Contains(err.Error(), "GOMLX_FUSION=0") {
			t.Errorf("engine.Gradient through graph.Softmax's fused op: %v, want a refusal naming the op and GOMLX_FUSION=0", err)
		}
	})
	t.Run("unfused", func(t *testing.T) {
		t.Setenv(graph.FusionEnv, "0")
		want := gtest.Run(t, build(graph.Gradient), x)
		got := gtest.Run(t, build(engine.Gradient), x)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("engine.Gradient %v, graph.Gradient %v", got, want)
		}
	})
}
