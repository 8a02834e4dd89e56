package engine_test

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
)

type dgCase struct {
	name    string
	lhsDims []int
	lc, lb  []int
	rhsDims []int
	rc, rb  []int
}

var dgCases = []dgCase{
	{"linear", []int{2, 5, 6}, []int{2}, nil, []int{4, 6}, []int{1}, nil},
	{"matrix", []int{3, 4}, []int{1}, nil, []int{4, 5}, []int{0}, nil},
	{"scores", []int{2, 5, 3, 4}, []int{3}, []int{0, 2}, []int{2, 7, 3, 4}, []int{3}, []int{0, 2}},
	{"probs-values", []int{2, 3, 5, 7}, []int{3}, []int{0, 1}, []int{2, 7, 3, 4}, []int{1}, []int{0, 2}},
	{"weight-grad-shape", []int{2, 5, 4}, []int{0, 1}, nil, []int{2, 5, 6}, []int{0, 1}, nil},
	{"reversed-contract", []int{3, 4, 2}, []int{2, 0}, nil, []int{2, 5, 3}, []int{0, 2}, nil},
	{"batch-last", []int{4, 3, 2}, []int{0}, []int{2}, []int{2, 4, 5}, []int{1}, []int{0}},
	// Small products with a contracting size of at least 16 and more than 16 columns (GoMLX v0.28.2's SIMD
	// builds got these with transposed operands; kept as cases of their own).
	{"vector-linear", []int{2, 5, 32}, []int{2}, nil, []int{24, 32}, []int{1}, nil},
	{"vector-scores", []int{2, 3, 5, 32}, []int{3}, []int{0, 1}, []int{2, 3, 20, 32}, []int{3}, []int{0, 1}},
	{"vector-weight-grad", []int{4, 8, 32}, []int{0, 1}, nil, []int{4, 8, 24}, []int{0, 1}, nil},
	{"vector-mixed", []int{32, 3, 20}, []int{0}, []int{1}, []int{3, 17, 32}, []int{2}, []int{0}},
}

// TestDotGeneralGradient compares the matmul-based gradient with GoMLX's own (the [M,N,K] one, fine at these
// sizes) for every layout memfit uses and a few awkward ones.
func TestDotGeneralGradient(t *testing.T) {
	for i, c := range dgCases {
		t.Run(c.name, func(t *testing.T) {
			lhs := gtest.Tensor(gtest.Rand(uint64(10+i), prod(c.lhsDims), 1), c.lhsDims...)
			rhs := gtest.Tensor(gtest.Rand(uint64(20+i), prod(c.rhsDims), 1), c.rhsDims...)
			var outDims []int
			build := func(custom bool) func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return func(g *graph.Graph, p []*graph.Node) []*graph.Node {
					var y *graph.Node
					if custom {
						y = engine.DotGeneral(p[0], c.lc, c.lb, p[1], c.rc, c.rb)
					} else {
						y = canonicalDotGeneral(p[0], c.lc, c.lb, p[1], c.rc, c.rb)
					}
					outDims = y.Shape().Dimensions
					w := graph.Sin(graph.IotaFull(g, y.Shape())) // fixed weights so every output element matters differently
					loss := graph.ReduceAllSum(graph.Mul(y, w))
					grads := engine.Gradient(loss, p[0], p[1])
					return []*graph.Node{y, grads[0], grads[1]}
				}
			}
			want := gtest.Run(t, build(false), lhs, rhs)
			got := gtest.Run(t, build(true), lhs, rhs)
			for k, name := range []string{"output", "dlhs", "drhs"} {
				if d := gtest.MaxAbsDiff(got[k], want[k]); d > 1e-5 {
					t.Errorf("%s (out %v): max |diff| %g", name, outDims, d)
				}
			}
		})
	}
}

// canonicalDotGeneral is graph.DotGeneral computed on operands first transposed to [batch..., free...,
// contracting...] (contracting axes in the order given), so that GoMLX's own DotGeneral gradient only ever sees
// in-order axes: GoMLX v0.28.2's gradient returns a wrongly shaped result for out-of-order contracting axes (the
// reversed-contract case: [3,5,2] for a [2,5,3] operand), and its Transpose gradient is plain.
func canonicalDotGeneral(lhs *graph.Node, lc, lb []int, rhs *graph.Node, rc, rb []int) *graph.Node {
	canon := func(x *graph.Node, contract, batch []int) *graph.Node {
		perm := append([]int(nil), batch...)
		for axis := 0; axis < x.Rank(); axis++ {
			if !slices.Contains(contract, axis) && !slices.Contains(batch, axis) {
				perm = append(perm, axis)
			}
		}
		perm = append(perm, contract...)
		return graph.TransposeAllDims(x, perm...)
	}
	l, r := canon(lhs, lc, lb), canon(rhs, rc, rb)
	axes := func(x *graph.Node, n int) (contract, batch []int) {
		for i := range n {
			contract = append(contract, x.Rank()-n+i)
		}
		for i := range len(lb) {
			batch = append(batch, i)
		}
		return contract, batch
	}
	lcc, lbb := axes(l, len(lc))
	rcc, rbb := axes(r, len(rc))
	return graph.DotGeneral(l, lcc, lbb, r, rcc, rbb)
}

func prod(d []int) int {
	p := 1
	for _, x := range d {
		p *= x
	}
	return p
}

// TestDotGeneralGradientIsMatmul checks structurally that the backward of engine.DotGeneral contains no tensor
// larger than its operands and output (GoMLX's own gradient builds an [M,N,K] product).
func TestDotGeneralGradientIsMatmul(t *testing.T) {
	x := gtest.Tensor(gtest.Rand(1, 4*32*64, 1), 4, 32, 64)
	w := gtest.Tensor(gtest.Rand(2, 48*64, 1), 48, 64)
	_, g := gtest.RunGraph(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		y := engine.Linear(p[0], p[1], nil)
		grads := engine.Gradient(graph.ReduceAllSum(graph.Square(y)), p[0], p[1])
		return grads
	}, x, w)
	limit := 4 * 32 * 64 // the largest operand
	for _, n := range g.Nodes() {
		if n.Shape().Size() > limit {
			t.Errorf("node %s has %d elements, more than any operand (%d)", n, n.Shape().Size(), limit)
		}
	}
}

// TestLinearBias checks Linear with a bias against a hand computation.
func TestLinearBias(t *testing.T) {
	x := gtest.Tensor([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	w := gtest.Tensor([]float32{1, 0, -1, 2, 1, 0}, 2, 3)
	b := gtest.Tensor([]float32{0.5, -0.5}, 2)
	out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		y := engine.Linear(p[0], p[1], p[2])
		grads := engine.Gradient(graph.ReduceAllSum(y), p[0], p[1], p[2])
		return append([]*graph.Node{y}, grads...)
	}, x, w, b)
	// y = x wᵀ + b: row0 = [1-3, 2+2] + b, row1 = [4-6, 8+5+0] + b
	want := [][]float32{{-1.5, 3.5, -1.5, 12.5}, {3, 1, -1, 3, 1, -1}, {5, 7, 9, 5, 7, 9}, {2, 2}}
	for i := range want {
		if d := gtest.MaxAbsDiff(out[i], want[i]); d > 1e-6 {
			t.Errorf("output %d = %v, want %v", i, out[i], want[i])
		}
	}
}

// TestLinearLayouts: the weight-on-the-left form for few rows and a weight held transposed (TransposedWeight)
// compute what the plain x·wᵀ computes, values and gradients, and no node of the held form copies the weight.
func TestLinearLayouts(t *testing.T) {
	w := gtest.Tensor(gtest.Rand(2, 96*32, 1), 96, 32)
	wT := gtest.Tensor(func() []float32 {
		v, out := gtest.Float32s(w), make([]float32, 96*32)
		for o := range 96 {
			for i := range 32 {
				out[i*96+o] = v[o*32+i]
			}
		}
		return out
	}(), 32, 96)
	for _, rows := range []int{1, 3, 40} { // 1 and 3 rows take the weight-on-the-left form, 40 the plain one
		x := gtest.Tensor(gtest.Rand(uint64(rows), rows*32, 1), rows, 1, 32)
		build := func(held bool) func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			return func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				weight := p[1]
				if held {
					weight = engine.TransposedWeight(p[1])
				}
				y := engine.Linear(p[0], weight, nil)
				grads := engine.Gradient(graph.ReduceAllSum(graph.Square(y)), p[0], p[1])
				return append([]*graph.Node{y}, grads...)
			}
		}
		plain := gtest.Run(t, build(false), x, w)
		held := gtest.Run(t, build(true), x, wT)
		// The plain reference for the held weight's gradient is the plain one transposed.
		gw := make([]float32, 96*32)
		for o := range 96 {
			for i := range 32 {
				gw[i*96+o] = plain[2][o*32+i]
			}
		}
		for k, pair := range [][2][]float32{{plain[0], held[0]}, {plain[1], held[1]}, {gw, held[2]}} {
			if d := gtest.MaxRelDiff(pair[1], pair[0], 1); d > 5e-5 { // float32 sums in other orders
				t.Errorf("%d rows, output %d: relative difference %g (abs %g)", rows, k, d, gtest.MaxAbsDiff(pair[1], pair[0]))
			}
		}
		// The forward product reads the held [in, out] weight itself.
		_, g := gtest.RunGraph(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			return []*graph.Node{engine.Linear(p[0], engine.TransposedWeight(p[1]), nil)}
		}, x, wT)
		direct := false
		for _, n := range g.Nodes() {
			if n.Type() == graph.NodeTypeDotGeneral && slices.Contains(n.Inputs(), g.Nodes()[1]) {
				direct = true
			}
		}
		if !direct {
			t.Errorf("%d rows: no product reads the held weight directly", rows)
		}
	}
}

// TestSliceGradient runs a slice gradient on the pure-Go backend (GoMLX's own needs Pad, which it lacks).
func TestSliceGradient(t *testing.T) {
	x := gtest.Tensor(gtest.Rand(3, 4*6, 1), 4, 6)
	out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		s := engine.Slice(p[0], []int{1, 2}, []int{3, -1})
		w := graph.AddScalar(graph.IotaFull(g, s.Shape()), 1)
		grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(s, w)), p[0])
		return []*graph.Node{s, grads[0]}
	}, x)
	if len(out[0]) != 2*3 {
		t.Fatalf("slice has %d elements, want 6", len(out[0]))
	}
	xs := gtest.Float32s(x)
	for i := 0; i < 2; i++ {
		for j := 0; j < 3; j++ {
			if out[0][i*3+j] != xs[(i+1)*6+j+2] {
				t.Errorf("slice[%d,%d] = %v, want %v", i, j, out[0][i*3+j], xs[(i+1)*6+j+2])
			}
		}
	}
	want := make([]float32, 24)
	for i := 0; i < 2; i++ {
		for j := 0; j < 3; j++ {
			want[(i+1)*6+j+2] = float32(i*3 + j + 1)
		}
	}
	if d := gtest.MaxAbsDiff(out[1], want); d != 0 {
		t.Errorf("gradient %v, want %v", out[1], want)
	}
}

// TestSetVJPOverridesGradient: a custom VJP replaces GoMLX's for that node only, and its backward nodes are
// attributed to its kind.
func TestSetVJPOverridesGradient(t *testing.T) {
	x := gtest.Tensor([]float32{1, 2, 3}, 3)
	var info engine.GradientInfo
	var gradID graph.NodeId
	out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		y := graph.Mul(p[0], p[0]) // true gradient 2x
		engine.SetVJP(y, engine.KindActivation, func(node, v *graph.Node) []*graph.Node {
			return []*graph.Node{graph.MulScalar(v, 10), nil}
		})
		z := graph.Exp(y) // keeps GoMLX's gradient
		grads := engine.Gradient(graph.ReduceAllSum(graph.Sub(z, y)), p[0])
		info, _ = engine.GradientInfoOf(g)
		gradID = grads[0].Id()
		return grads
	}, x)
	// d/dx of sum(exp(y) - y) with dy/dx forced to 10: (exp(x²) - 1) * 10.
	for i, xv := range []float64{1, 2, 3} {
		want := (float32(expf(xv*xv)) - 1) * 10
		if rel := float64((out[0][i] - want) / want); rel > 1e-5 || rel < -1e-5 {
			t.Errorf("grad[%d] = %v, want %v", i, out[0][i], want)
		}
	}
	if k, ok := info.KindOfBackward(gradID); !ok || k != engine.KindActivation {
		t.Errorf("final gradient node attributed to %v (found %v), want activation", k, ok)
	}
}

func expf(x float64) float64 {
	return float64(float32(math.Exp(x)))
}

// TestSideTableDoesNotLeak builds many graphs with custom gradients, drops them and checks that the side table
// empties: no entry keeps an old graph alive.
func TestSideTableDoesNotLeak(t *testing.T) {
	// Let earlier tests' dropped graphs be cleaned up first, so that the count below moves only with ours.
	before := -1
	for i := 0; i < 100 && before != engine.TableSizeForTest(); i++ {
		before = engine.TableSizeForTest()
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	before = engine.TableSizeForTest()
	// The graphs are held until the growth is checked (a GC during the loop could otherwise clean up the first
	// ones already), then dropped.
	var held []*graph.Graph
	for i := 0; i < 50; i++ {
		err := engine.Try(func() {
			g := graph.NewGraph(gtest.Backend(t), fmt.Sprintf("leak%d", i))
			held = append(held, g)
			x := graph.Parameter(g, "x", tensors.FromValue([]float32{1, 2}).Shape())
			y := engine.Linear(graph.InsertAxes(x, 0), graph.Reshape(x, 1, 2), nil)
			_ = engine.Gradient(graph.ReduceAllSum(y), x)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if engine.TableSizeForTest() < before+50 {
		t.Fatalf("table grew to %d only, custom gradients were not registered", engine.TableSizeForTest())
	}
	held = nil
	deadline := time.Now().Add(20 * time.Second)
	for engine.TableSizeForTest() > before && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n := engine.TableSizeForTest(); n > before {
		t.Fatalf("side table still holds %d entries (started with %d) after the graphs were dropped", n, before)
	}
}

// TestConcurrentGraphBuilding builds and differentiates graphs from several goroutines (run with -race).
func TestConcurrentGraphBuilding(t *testing.T) {
	b := gtest.Backend(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			errs <- engine.Try(func() {
				g := graph.NewGraph(b, fmt.Sprintf("conc%d", w))
				x := graph.Parameter(g, "x", tensors.FromValue([][]float32{{1, 2, 3}}).Shape())
				wt := graph.Parameter(g, "w", tensors.FromValue([][]float32{{1, 2, 3}, {4, 5, 6}}).Shape())
				y := engine.Linear(x, wt, nil)
				grads := engine.Gradient(graph.ReduceAllSum(y), x, wt)
				g.Compile(grads...)
				res := g.Run(tensors.FromValue([][]float32{{1, 2, 3}}), tensors.FromValue([][]float32{{1, 2, 3}, {4, 5, 6}}))
				dx := gtest.Float32s(res[0])
				if dx[0] != 5 || dx[1] != 7 || dx[2] != 9 {
					panic(fmt.Sprintf("worker %d: dx = %v", w, dx))
				}
			})
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestProductsInKernelLayoutStay: a product already in one of the Go backend's kernel layouts reaches it as
// written, small or large (compute v0.1.14's small transposed kernel is as fast as the non-transposed one, so no
// operand is copied to change layout; GoMLX v0.28.2 needed small x·wᵀ products copied into the non-transposed one).
func TestProductsInKernelLayoutStay(t *testing.T) {
	var small, large *graph.Node
	gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		small = engine.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil) // [64,32] x [48,32]ᵀ: 98 Ki multiply-adds
		large = engine.DotGeneral(p[2], []int{1}, nil, p[3], []int{1}, nil) // [512,256] x [256,256]ᵀ: 32 Mi
		return []*graph.Node{small, large}
	}, gtest.Tensor(gtest.Rand(1, 64*32, 1), 64, 32), gtest.Tensor(gtest.Rand(2, 48*32, 1), 48, 32),
		gtest.Tensor(gtest.Rand(3, 512*256, 1), 512, 256), gtest.Tensor(gtest.Rand(4, 256*256, 1), 256, 256))
	for name, n := range map[string]*graph.Node{"small": small, "large": large} {
		for i, in := range n.Inputs() {
			if in.Type() == graph.NodeTypeTranspose {
				t.Errorf("%s product: operand %d transposed, want it left as written", name, i)
			}
		}
	}
}

// BenchmarkHeldProduct times decoding's one-row product by a weight held transposed (llama-tiny's head,
// [rows,128]·[128,4096]) as engine.Linear builds it, against the unpadded product the backend's small
// non-transposed kernel runs with its scalar remainder loop (see engine.Linear).
func BenchmarkHeldProduct(b *testing.B) {
	wT := gtest.Tensor(gtest.Rand(2, 128*4096, 1), 128, 4096)
	for _, rows := range []int{1, 3, 4} {
		x := gtest.Tensor(gtest.Rand(1, rows*128, 1), rows, 128)
		for _, c := range []struct {
			name  string
			build func(x, wT *graph.Node) *graph.Node
		}{
			{"linear", func(x, wT *graph.Node) *graph.Node { return engine.Linear(x, engine.TransposedWeight(wT), nil) }},
			{"unpadded", func(x, wT *graph.Node) *graph.Node { return graph.DotGeneral(x, []int{1}, nil, wT, []int{0}, nil) }},
		} {
			b.Run(fmt.Sprintf("rows%d/%s", rows, c.name), func(b *testing.B) {
				g := graph.NewGraph(gtest.Backend(b), c.name)
				y := c.build(graph.Parameter(g, "x", x.Shape()), graph.Parameter(g, "w", wT.Shape()))
				if err := g.Compile(y); err != nil {
					b.Fatal(err)
				}
				for range b.N {
					g.Run(x, wT)[0].FinalizeAll()
				}
			})
		}
	}
}
