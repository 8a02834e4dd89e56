package memory

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
)

// backendFor returns one backend per spec, shared by the tests ("" is the default).
func backendFor(t *testing.T, spec string) compute.Backend {
	t.Helper()
	if spec == "" {
		return gtest.Backend(t)
	}
	return gtest.BackendFor(t, spec)
}

// compileGraph builds and compiles a graph with parameters of the given shapes on the backend spec ("" is the
// default pure-Go backend).
func compileGraph(t *testing.T, spec string, params []shapes.Shape, build func(g *graph.Graph, p []*graph.Node) []*graph.Node) *graph.Graph {
	t.Helper()
	var g *graph.Graph
	err := engine.Try(func() {
		g = graph.NewGraph(backendFor(t, spec), t.Name())
		ps := make([]*graph.Node, len(params))
		for i, s := range params {
			ps[i] = graph.Parameter(g, fmt.Sprintf("p%d", i), s)
		}
		if err := g.Compile(build(g, ps)...); err != nil {
			panic(err) // engine.Try returns it
		}
	})
	if err != nil {
		t.Fatalf("building graph: %v", err)
	}
	return g
}

func f32(dims ...int) shapes.Shape  { return shapes.Make(dtypes.Float32, dims...) }
func bf16(dims ...int) shapes.Shape { return shapes.Make(dtypes.BFloat16, dims...) }

func mustRead(t *testing.T, g *graph.Graph) *goExec {
	t.Helper()
	x, err := readGoBackend(g)
	if err != nil {
		t.Fatalf("readGoBackend: %v", err)
	}
	return x
}

func mustSim(t *testing.T, g *graph.Graph, opts SimOptions) simResult {
	t.Helper()
	r, err := simulate(mustRead(t, g), opts)
	if err != nil {
		t.Fatalf("simulate: %v", err)
	}
	p, err := SimulatePeak(g, opts)
	if err != nil {
		t.Fatalf("SimulatePeak: %v", err)
	}
	if p != r.peak {
		t.Fatalf("SimulatePeak %+v != simulate %+v", p, r.peak)
	}
	return r
}

// workers is how many large-matmul workers x's backend can start.
func workers(x *goExec) int {
	w, _ := x.largeMatmulWorkers()
	return w
}

// execOps lists the executor's node ops, for checking the graph the executor really runs.
func execOps(x *goExec) string {
	ops := make([]string, len(x.nodes))
	for i, n := range x.nodes {
		ops[i] = n.op.String()
	}
	return strings.Join(ops, " ")
}

// defaultWorkers is how many large-matmul workers a default Go backend can start (workerspool.New sets
// maxParallelism to 2 x GOMAXPROCS; one CPU runs the product on the calling goroutine).
func defaultWorkers() int {
	if runtime.GOMAXPROCS(0) <= 1 {
		return 1
	}
	return 2 * runtime.GOMAXPROCS(0)
}

// TestGoBackendInternals fails loudly when the Go backend's unexported executor state no longer has the shape
// memfit reads (field names, types, enum values, the DotGeneral normalisation and its node data, the data of
// each node type) or when the backend gains an op the simulation does not model.
func TestGoBackendInternals(t *testing.T) {
	caps := gtest.Backend(t).Capabilities()
	for op, ok := range caps.Operations {
		if !ok {
			continue
		}
		n := 0
		for _, in := range []bool{simModelled(op), simBuilderOnly[op], simRefused[op] != ""} {
			if in {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the Go backend supports %s, which the simulation models in %d ways (modelled %v, builder-only %v, "+
				"refused %q): read its executor and list it once", op, n, simModelled(op), simBuilderOnly[op], simRefused[op])
		}
	}

	g := compileGraph(t, "", []shapes.Shape{f32(3, 4), f32(5, 4), shapes.Make(dtypes.Uint64, graph.RNGStateShape.Dimensions...)},
		func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil) // [3,5]
			s := graph.ReduceSum(y, 1)
			a := graph.ArgMax(y, 1)
			c := graph.Add(s, graph.Const(g, []float32{1, 2, 3}))
			st, r := graph.RandomUniform(p[2], f32(2))
			e1, e2 := graph.Exp(c), graph.Exp(c) // de-duplicated by the builder
			return []*graph.Node{graph.Add(e1, e2), a, st, r}
		})
	x := mustRead(t, g)
	if !x.sequential || !x.creationOrder {
		t.Errorf("engine's default backend read as sequential=%v creationOrder=%v, want ops_sequential and the "+
			"creation-order schedule (engine.GoOptions)", x.sequential, x.creationOrder)
	}
	if x.maxParallelism != 2*runtime.GOMAXPROCS(0) || workers(x) != defaultWorkers() || x.noOps {
		t.Errorf("maxParallelism %d (workers %d, no_ops %v), want workerspool's default 2 x GOMAXPROCS = %d", x.maxParallelism,
			workers(x), x.noOps, 2*runtime.GOMAXPROCS(0))
	}
	if len(x.inputs) != 3 || len(x.outputs) != 4 || len(x.numUses) != x.numNodesToProcess {
		t.Fatalf("inputs %v, outputs %v, %d numUses for %d nodes", x.inputs, x.outputs, len(x.numUses), x.numNodesToProcess)
	}
	var dots, reshapesAfterDot, reduces, argmax, consts, rngs, exps int
	for i, n := range x.nodes {
		switch n.op {
		case compute.OpTypeDotGeneral:
			dots++
			d := n.dot
			if d == nil || d.batchSize != 1 || d.lhsCrossSize != 3 || d.rhsCrossSize != 5 || d.contractingSize != 4 ||
				fmt.Sprint(d.lhsContractingAxes, d.rhsContractingAxes, d.lhsBatchAxes, d.rhsBatchAxes) != "[1] [1] [] []" ||
				d.inputDType != dtypes.Float32 || d.outputDType != dtypes.Float32 || d.impl != wantFloat32DotImpl() {
				t.Errorf("DotGeneral data %+v, want sizes 1,3,5,4, axes [1] [1], float32 and implementation %q", d, wantFloat32DotImpl())
			}
			if !n.shape.Equal(f32(3, 5)) {
				t.Errorf("DotGeneral shape %s, want the product's own [3,5] (compute v0.1.14 adds no Reshape)", n.shape)
			}
			if d.lhsCache.present || d.rhsCache.present {
				t.Errorf("DotGeneral of two parameters has panel caches %+v %+v", d.lhsCache, d.rhsCache)
			}
			for _, c := range x.nodes[i+1:] {
				if c.op == compute.OpTypeReshape && slices.Equal(c.inputs, []int{i}) {
					reshapesAfterDot++
				}
			}
		case compute.OpTypeReduceSum:
			reduces++
			if r := n.reduce; r == nil || fmt.Sprint(r.axes) != "[1]" || r.pattern != reduceTrailing || r.a != 3 || r.b != 5 {
				t.Errorf("ReduceSum config %+v, want axes [1], trailing, A=3 B=5", r)
			}
		case compute.OpTypeArgMinMax:
			argmax++
			if n.argAxis != 1 {
				t.Errorf("ArgMinMax axis %d, want 1", n.argAxis)
			}
		case compute.OpTypeConstant:
			consts++
			if n.constRawBytes != bufferBytes(n.shape) {
				t.Errorf("constant %s holds %d bytes, want the bucketed %d", n.shape, n.constRawBytes, bufferBytes(n.shape))
			}
		case compute.OpTypeExp:
			exps++
			if i < x.numNodesToProcess && x.numUses[i] != 2 {
				t.Errorf("the de-duplicated Exp has %d uses, want 2", x.numUses[i])
			}
		case compute.OpTypeRNGBitGenerator:
			if len(n.multiShapes) == 2 {
				rngs++
				for j, m := range n.multiNodes {
					if m <= i || !x.nodes[m].shape.Equal(n.multiShapes[j]) || !slices.Equal(x.nodes[m].inputs, []int{i}) {
						t.Errorf("RNG output %d: node #%d shaped %s with inputs %v, want after #%d, shaped %s, reading it",
							j, m, x.nodes[m].shape, x.nodes[m].inputs, i, n.multiShapes[j])
					}
				}
			}
		}
	}
	if dots != 1 || reshapesAfterDot != 0 || reduces != 1 || argmax != 1 || consts < 1 || rngs != 1 || exps != 1 {
		t.Errorf("found %d DotGeneral (%d followed by their Reshape), %d ReduceSum, %d ArgMinMax, %d constants, %d RNG, "+
			"%d Exp (want 1 after de-duplication):\n%s", dots, reshapesAfterDot, reduces, argmax, consts, rngs, exps, execOps(x))
	}
	// The schedule runs every used node once, after its inputs.
	pos := map[int]int{}
	for i, idx := range x.schedule {
		if _, dup := pos[idx]; dup {
			t.Fatalf("node #%d twice in the schedule %v", idx, x.schedule)
		}
		pos[idx] = i
	}
	for idx := range x.numNodesToProcess {
		if x.numUses[idx] == 0 {
			continue
		}
		p, ok := pos[idx]
		if !ok {
			t.Errorf("used node #%d not in the schedule %v", idx, x.schedule)
		}
		for _, in := range x.nodes[idx].inputs {
			if pos[in] >= p {
				t.Errorf("node #%d scheduled before its input #%d", idx, in)
			}
		}
	}
	// The node data of the fused ops and the newer executors (compute v0.1.14).
	gf := compileGraph(t, "", []shapes.Shape{f32(6, 8), f32(8, 5), f32(5), f32(2, 4, 3, 8), f32(6, 5)},
		func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			cfg := compute.DenseConfig{WeightLayout: compute.DenseLayoutInputOutputs}
			y := graph.BackendFusedDense(p[0], p[1], p[2], cfg) // [6,5]
			dx, dw, db := graph.BackendFusedDenseVJP(p[0], p[1], p[2], y, p[4], cfg)
			act := graph.BackendFusedActivation(y, compute.ActivationConfig{Type: compute.ActivationGelu})
			sdpa, _ := graph.BackendFusedScaledDotProductAttention(p[3], p[3], p[3], compute.AttentionAxesLayoutBHSD,
				&compute.ScaledDotProductAttentionConfig{Scale: 0.5})
			upd := graph.DynamicUpdateSlice(p[4], graph.Slice(act, graph.AxisRange(0, 2)),
				[]*graph.Node{graph.Const(g, int32(1)), graph.Const(g, int32(0))})
			return []*graph.Node{dx, dw, db, sdpa, upd, graph.CumSum(p[0], 1)}
		})
	xf := mustRead(t, gf)
	seen := map[compute.OpType]bool{}
	for _, n := range xf.nodes {
		seen[n.op] = true
		switch n.op {
		case compute.OpTypeFusedDense, compute.OpTypeFusedDenseVJP:
			if n.selectOutput {
				continue
			}
			if d := n.dense; d == nil || d.rows != 6 || d.in != 8 || d.out != 5 ||
				d.hasBias != (n.op == compute.OpTypeFusedDenseVJP) || d.lhsCache.present || d.rhsCache.present {
				t.Errorf("%s node data %+v, want 6 rows, 8 in, 5 out, no caches", n.op, d)
			}
		case compute.OpTypeFusedScaledDotProductAttention:
			if sd := n.sdpa; sd == nil || sd.bshd || sd.hasMask || sd.hasSeqLens || sd.hasBias {
				t.Errorf("SDPA node data %+v, want BHSD, no mask, no sequence lengths, no bias", sd)
			}
		}
	}
	for _, op := range []compute.OpType{compute.OpTypeFusedDense, compute.OpTypeFusedDenseVJP,
		compute.OpTypeFusedActivation, compute.OpTypeFusedScaledDotProductAttention,
		compute.OpTypeDynamicUpdateSlice, compute.OpTypeCumSum} {
		if !seen[op] {
			t.Errorf("the fused-ops graph has no %s node:\n%s", op, execOps(xf))
		}
	}
	mustSim(t, gf, SimOptions{})

	if est, err := x.estimatedTemporaryMemory(); err != nil || est <= 0 {
		t.Errorf("EstimatedTemporaryMemory: %d, %v", est, err)
	}
	mustSim(t, g, SimOptions{})

	// Backend options the simulation reads.
	for spec, want := range map[string]struct {
		seq, creation bool
		workers       int
	}{
		"go:ops_sequential,creation_order": {true, true, defaultWorkers()},
		"go:ops_sequential,parallelism=1":  {true, true, 1},
		"go:ops_sequential,parallelism=0":  {true, true, 1},
		"go:ops_parallel":                  {false, true, defaultWorkers()},
		"go:dependency_order":              {true, false, defaultWorkers()},
	} {
		g := compileGraph(t, spec, []shapes.Shape{f32(2)}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			return []*graph.Node{graph.Neg(graph.Exp(p[0]))}
		})
		x := mustRead(t, g)
		if x.sequential != want.seq || x.creationOrder != want.creation || workers(x) != want.workers {
			t.Errorf("%s: read sequential=%v creationOrder=%v workers=%d, want %v %v %d", spec, x.sequential,
				x.creationOrder, workers(x), want.seq, want.creation, want.workers)
		}
		if want.creation && !slices.Equal(x.schedule, []int{0, 1, 2}) {
			t.Errorf("%s: schedule %v, want creation order", spec, x.schedule)
		}
	}
}

// TestSimulateHandComputed checks the simulation against peaks worked out by hand from the Go backend's
// executor code. Every buffer's size is its bytes rounded up by support.TwoBitBucketLen (powers of two and 1.5
// times powers of two: 100 -> 128, 80 -> 96, 40 -> 48, 12 -> 12).
func TestSimulateHandComputed(t *testing.T) {
	const v = 256 * 4 // bytes of a [256] float32, a bucket size already
	impl := wantFloat32DotImpl()
	// One worker's panels on the large matmul path: an LHS panel Mc x Kc and an RHS panel Kc x Nc of input
	// values, an output panel Mc x Nc and an accumulator of 64 output panels (16 for the AVX kernels on the
	// calling goroutine), output values in float32. nosimd.go's NoSIMDParams (Kc 512, Mc 2, Nc 512) serve every
	// dtype; avx512.go: float32 Kc 192, Mc 32, Nc 512, bfloat16 Kc 128, Mc 32, Nc 768; avx2.go: float32 Kc 128,
	// Mc 32, Nc 512, bfloat16 as AVX-512.
	type panelSet struct{ f32Seq, f32Par, bf16Seq, bf16Par, f32SeqNoRHS int64 }
	ps := map[string]panelSet{
		"simd:nosimd": {2*512*4 + 512*512*4 + 2*512*4 + 64*2*512*4, 1318912, 2*512*2 + 512*512*2 + 2*512*4 + 64*2*512*4,
			792576, 2*512*4 + 2*512*4 + 64*2*512*4}, // 1318912, 792576, 270336
		"simd:avx512": {32*192*4 + 192*512*4 + 32*512*4 + 16*32*512*4, 32*192*4 + 192*512*4 + 32*512*4 + 64*32*512*4,
			32*128*2 + 128*768*2 + 32*768*4 + 16*32*768*4, 32*128*2 + 128*768*2 + 32*768*4 + 64*32*768*4,
			32*192*4 + 32*512*4 + 16*32*512*4}, // 1531904, 4677632, 1875968, 6594560, 1138688
		"simd:avx2": {32*128*4 + 128*512*4 + 32*512*4 + 16*32*512*4, 32*128*4 + 128*512*4 + 32*512*4 + 64*32*512*4,
			1875968, 6594560, 32*128*4 + 32*512*4 + 16*32*512*4}, // 1392640, 4538368, 1130624
	}[impl]
	simdReduce := goBackendEnv().simdExecutors
	w := int64(defaultWorkers())
	const seq1 = "go:ops_sequential,parallelism=1"
	cases := []struct {
		name         string
		spec         string
		params       []shapes.Shape
		donate       []bool
		workers      int
		build        func(g *graph.Graph, p []*graph.Node) []*graph.Node
		wantOps      string // the executor's nodes, "": don't check
		bytes, resid int64
		outputs      int64
	}{
		{
			// Exp allocates (x is used again), Neg and Add reuse it: x + one buffer.
			name: "unary-binary-reuse", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(graph.Neg(graph.Exp(p[0])), p[0])}
			},
			wantOps: "Parameter Exp Neg Add", bytes: 2 * v, resid: v, outputs: v,
		},
		{
			// Donated x: Exp still allocates (x has another use), Add takes x's buffer (rhs first) and frees Neg's.
			name: "donated", params: []shapes.Shape{f32(256)}, donate: []bool{true},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(graph.Neg(graph.Exp(p[0])), p[0])}
			},
			bytes: 2 * v, resid: 0, outputs: v,
		},
		{
			// Buckets: a [5,5] float32 is 100 bytes, held as 128 (x transferred by BufferFromFlatData, Exp's
			// buffer from GetBuffer).
			name: "bucketed", params: []shapes.Shape{f32(5, 5)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Exp(p[0])}
			},
			bytes: 128 + 128, resid: 128, outputs: 128,
		},
		{
			// e used twice by the same Mul is never owned there: x + e + y.
			name: "same-input-twice", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				e := graph.Exp(p[0])
				return []*graph.Node{graph.Mul(e, e)}
			},
			bytes: 3 * v, resid: v, outputs: v,
		},
		{
			// Two live intermediates: Exp(x) and Sin(x) are both live when Mul runs, which reuses Sin's.
			name: "two-live", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Mul(graph.Exp(p[0]), graph.Sin(p[0]))}
			},
			bytes: 3 * v, resid: v, outputs: v,
		},
		{
			// The builder de-duplicates the two Exp(x): one Exp used twice, so Sin copies, Cos reuses it and Add
			// reuses Cos's (rhs): x + e + sin.
			name: "dedup", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(graph.Sin(graph.Exp(p[0])), graph.Cos(graph.Exp(p[0])))}
			},
			wantOps: "Parameter Exp Sin Cos Add", bytes: 3 * v, resid: v, outputs: v,
		},
		{
			// OptimizationBarrier (ops/optimizationbarrier.go) copies y, still used by Add; Add reuses y (rhs, its
			// last use) and frees the copy: x + y + copy.
			name: "barrier-copies", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				y := graph.Exp(p[0])
				return []*graph.Node{graph.Add(graph.OptimizationBarrier(y), y)}
			},
			wantOps: "Parameter Exp OptimizationBarrier Add", bytes: 3 * v, resid: v, outputs: v,
		},
		{
			// At its only use the barrier takes y over: x + y.
			name: "barrier-reuses", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Neg(graph.OptimizationBarrier(graph.Exp(p[0])))}
			},
			wantOps: "Parameter Exp OptimizationBarrier Neg", bytes: 2 * v, resid: v, outputs: v,
		},
		{
			// An output that is a parameter is cloned at the end.
			name: "output-is-parameter", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{p[0], graph.Exp(p[0])}
			},
			bytes: 3 * v, resid: v, outputs: 2 * v,
		},
		{
			// The dependency-order schedule runs the long Sin-Neg chain first and Exp before the ReduceSum that
			// consumes it: Sin's buffer (1024, reused by the Negs), Exp's (1024) and the sum (4) are live together.
			name: "dependency-order", spec: "go:dependency_order", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				a := graph.ReduceAllSum(graph.Exp(p[0]))
				b := graph.Neg(graph.Neg(graph.Neg(graph.Sin(p[0]))))
				return []*graph.Node{graph.Add(b, a)}
			},
			wantOps: "Parameter Exp ReduceSum Sin Neg Neg Neg Add", bytes: v + 2*v + 4, resid: v, outputs: v,
		},
		{
			// The same in creation order: Exp, then its sum (Exp freed), then Sin: at most 1024 + 4.
			name: "creation-order", spec: "go:ops_sequential,creation_order", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				a := graph.ReduceAllSum(graph.Exp(p[0]))
				b := graph.Neg(graph.Neg(graph.Neg(graph.Sin(p[0]))))
				return []*graph.Node{graph.Add(b, a)}
			},
			bytes: v + v + 4, resid: v, outputs: v,
		},
		{
			// Operands already [cross, contracting]: the builder adds no Transpose; the normalised output [1,4,5]
			// (80 bytes -> 96) is taken over by the Reshape. Inputs [4,8] 128 and [5,8] 160 -> 192; small path,
			// no scratch.
			name: "dot-normalized", params: []shapes.Shape{f32(4, 8), f32(5, 8)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil)}
			},
			wantOps: "Parameter Parameter DotGeneral", bytes: 320 + 96, resid: 320, outputs: 96,
		},
		{
			// Both operands contracted on axis 0: the builder transposes each into a new buffer ([4,8] 128 and
			// [5,8] 192), freed after the DotGeneral.
			name: "dot-transposed", params: []shapes.Shape{f32(8, 4), f32(8, 5)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{0}, nil, p[1], []int{0}, nil)}
			},
			wantOps: "Parameter Parameter Transpose Transpose DotGeneral", bytes: 320 + 128 + 192 + 96, resid: 320, outputs: 96,
		},
		{
			// bfloat16: the DotGeneral outputs float32 [1,4,5] (96), converted to bfloat16 (40 bytes -> 48) while it
			// is still held, then reshaped in place. Inputs 64 and 80 -> 96.
			name: "dot-bf16", params: []shapes.Shape{bf16(4, 8), bf16(5, 8)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil)}
			},
			wantOps: "Parameter Parameter DotGeneral ConvertDType", bytes: 160 + 96 + 48, resid: 160, outputs: 48,
		},
		{
			// 256 x 128 x 128 = 4 Mi multiply-adds: the large path. Inputs 131072 + 65536, output [1,256,128]
			// 131072, one worker's panels (parallelism=1).
			name: "dot-large-1-worker", spec: seq1, params: []shapes.Shape{f32(256, 128), f32(128, 128)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{0}, nil)}
			},
			wantOps: "Parameter Parameter DotGeneral", bytes: 196608 + 131072 + ps.f32Seq, resid: 196608, outputs: 131072,
		},
		{
			// The same on a default backend: every worker Saturate can start holds its panels (the upper bound).
			name: "dot-large-all-workers", params: []shapes.Shape{f32(256, 128), f32(128, 128)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{0}, nil)}
			},
			bytes: 196608 + 131072 + w*ps.f32Par, resid: 196608, outputs: 131072,
		},
		{
			// The same, assuming one worker (which takes the pool path's panels).
			name: "dot-large-assume-1", workers: 1, params: []shapes.Shape{f32(256, 128), f32(128, 128)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{0}, nil)}
			},
			bytes: 196608 + 131072 + ps.f32Par, resid: 196608, outputs: 131072,
		},
		{
			// 255 x 128 x 128 is under the threshold: small path, no panels. [255,128] is 130560 bytes -> 131072.
			name: "dot-just-small", spec: seq1, params: []shapes.Shape{f32(255, 128), f32(128, 128)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{0}, nil)}
			},
			bytes: 131072 + 65536 + 131072, resid: 131072 + 65536, outputs: 131072,
		},
		{
			// bfloat16 large: inputs 65536 + 32768, float32 output 131072 and the panels (bfloat16 inputs, float32
			// output panel) dominate the later conversion (131072 + 65536).
			name: "dot-large-bf16", spec: seq1, params: []shapes.Shape{bf16(256, 128), bf16(128, 128)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{0}, nil)}
			},
			bytes: 98304 + 131072 + ps.bf16Seq, resid: 98304, outputs: 65536,
		},
		{
			// Batch 4 of 64 x 128 x 128: 4 Mi multiply-adds in all, 1 Mi per matrix. nosimd and AVX-512 route on the
			// total (large path), AVX2 on one matrix (small path). Inputs 131072 + 262144, output 131072.
			name: "dot-batched", spec: seq1, params: []shapes.Shape{f32(4, 64, 128), f32(4, 128, 128)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{2}, []int{0}, p[1], []int{1}, []int{0})}
			},
			wantOps: "Parameter Parameter DotGeneral", resid: 393216, outputs: 131072,
			bytes: 393216 + 131072 + map[bool]int64{true: 0, false: ps.f32Seq}[impl == "simd:avx2"],
		},
		{
			// ArgMax over axis 0 of [64,16]: int32 output [16] (64 bytes), then running best values (16 float32)
			// and indices (16 int32), 64 bytes each.
			name: "argmax", params: []shapes.Shape{f32(64, 16)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.ArgMax(p[0], 0, dtypes.Int32)}
			},
			wantOps: "Parameter ArgMinMax", bytes: 4096 + 64 + 64 + 64, resid: 4096, outputs: 64,
		},
		{
			// ReduceSum of bfloat16 [64,16] over axis 0 (a leading reduction, A=64 B=16): output [16] bfloat16 (32).
			// The SIMD executor (GOEXPERIMENT=simd) takes nothing else; the generic one a float32 accumulator of
			// the kept axis, [16] (64), for the call.
			name: "reducesum-bf16-leading", params: []shapes.Shape{bf16(64, 16)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.ReduceSum(p[0], 0)}
			},
			wantOps: "Parameter ReduceSum", bytes: 2048 + 32 + map[bool]int64{true: 0, false: 64}[simdReduce], resid: 2048, outputs: 32,
		},
		{
			// Over the middle axis of bfloat16 [4,16,8]: output [4,8] (64); no SIMD executor for middle reductions,
			// the generic one's float32 accumulator of the inner axis, [8] (32).
			name: "reducesum-bf16-middle", params: []shapes.Shape{bf16(4, 16, 8)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.ReduceSum(p[0], 1)}
			},
			wantOps: "Parameter ReduceSum", bytes: 1024 + 64 + 32, resid: 1024, outputs: 64,
		},
		{
			// Over an axis of size 1: nothing is reduced, and the generic executor takes Exp's owned buffer over.
			name: "reduce-nothing-in-place", params: []shapes.Shape{f32(256, 1)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.ReduceSum(graph.Exp(p[0]), 1)}
			},
			wantOps: "Parameter Exp ReduceSum", bytes: 2 * v, resid: v, outputs: v,
		},
		{
			// ReduceMax of int64 [64,16] over axis 1 (trailing, B=16): in SIMD builds the SIMD executor takes the
			// output [64] (512), finds no int64 kernel and falls back without returning it (kept), on this first
			// run; then the generic executor's output (512).
			name: "reducemax-int64-leak", params: []shapes.Shape{shapes.Make(dtypes.Int64, 64, 16)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.ReduceMax(p[0], 1)}
			},
			wantOps: "Parameter ReduceMax", bytes: 8192 + 512 + map[bool]int64{true: 512, false: 0}[simdReduce],
			resid: 8192 + map[bool]int64{true: 512, false: 0}[simdReduce], outputs: 512,
		},
		{
			// A large product whose RHS is a constant [128,128] (65536, resident): on its first run the kernel
			// packs the constant's panels into a pool buffer the graph keeps (128 columns rounded to the register
			// block, times 128: 65536, kept) and takes no RHS panel. Input 131072, output 131072.
			name: "dot-constant-rhs", spec: seq1, params: []shapes.Shape{f32(256, 128)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				w := make([][]float32, 128)
				for i := range w {
					w[i] = make([]float32, 128)
				}
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, graph.Const(g, w), []int{0}, nil)}
			},
			wantOps: "Parameter Constant DotGeneral", bytes: 131072 + 65536 + 131072 + 65536 + ps.f32SeqNoRHS,
			resid: 131072 + 65536 + 65536, outputs: 131072,
		},
		{
			// A constant is resident (built from the pool, held by the graph) and, as an output, cloned.
			name: "constant", params: []shapes.Shape{f32(4)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				c := graph.Const(g, make([]float32, 256))
				return []*graph.Node{graph.Add(p[0], graph.Const(g, []float32{1, 2, 3, 4})), c}
			},
			bytes: 16 + v + 16 + 16 + v, resid: 16 + v + 16, outputs: 16 + v,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := compileGraph(t, c.spec, c.params, c.build)
			x := mustRead(t, g)
			if c.wantOps != "" && execOps(x) != c.wantOps {
				t.Errorf("executor nodes %q, want %q", execOps(x), c.wantOps)
			}
			r := mustSim(t, g, SimOptions{Donate: c.donate, MatmulWorkers: c.workers})
			if r.peak.Bytes != c.bytes || r.peak.Resident != c.resid || r.peak.Method != MethodSimulation {
				t.Errorf("peak %+v, want Bytes %d Resident %d", r.peak, c.bytes, c.resid)
			}
			if r.endLive != c.outputs {
				t.Errorf("held at the end %d, want the outputs' %d", r.endLive, c.outputs)
			}
		})
	}
}

// TestSimulateTrainingStep runs the simulation on a small training step built with engine and checks its
// invariants: the outputs are what is held at the end, the peak lies above resident + outputs, and donating
// the inputs lowers the resident bytes by exactly their size.
func TestSimulateTrainingStep(t *testing.T) {
	const batch, din, dh, dout = 16, 32, 64, 8
	params := []shapes.Shape{f32(batch, din), f32(dh, din), f32(dh), f32(dout, dh), f32(dout)}
	g := compileGraph(t, "", params, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		h := engine.Linear(p[0], p[1], p[2])
		h = graph.Mul(graph.MulScalar(h, 0.5), graph.OnePlus(graph.Erf(graph.MulScalar(h, 0.7071067811865476))))
		y := engine.Linear(h, p[3], p[4])
		loss := graph.ReduceAllMean(graph.Square(y))
		return append([]*graph.Node{loss}, engine.Gradient(loss, p[1], p[2], p[3], p[4])...)
	})
	r := mustSim(t, g, SimOptions{})
	var in, out int64
	for _, s := range params {
		in += bufferBytes(s)
	}
	out = 4 + bufferBytes(params[1]) + bufferBytes(params[2]) + bufferBytes(params[3]) + bufferBytes(params[4])
	x := mustRead(t, g)
	if r.peak.Resident != in+x.constantBytes() {
		t.Errorf("resident %d, want inputs %d + constants %d", r.peak.Resident, in, x.constantBytes())
	}
	if r.endLive != out {
		t.Errorf("held at the end %d, want outputs %d", r.endLive, out)
	}
	// The hidden activations [16,64] are at least live once beside the inputs and outputs.
	if r.peak.Bytes < r.peak.Resident+out+int64(batch*dh*4) {
		t.Errorf("peak %d below resident %d + outputs %d + one activation", r.peak.Bytes, r.peak.Resident, out)
	}
	d := mustSim(t, g, SimOptions{Donate: []bool{true, false, false, false, false}})
	if r.peak.Resident-d.peak.Resident != bufferBytes(params[0]) {
		t.Errorf("donating x changed resident by %d, want %d", r.peak.Resident-d.peak.Resident, bufferBytes(params[0]))
	}
	if d.peak.Bytes > r.peak.Bytes {
		t.Errorf("donating x raised the peak: %d > %d", d.peak.Bytes, r.peak.Bytes)
	}
	_, tl, err := SimulateTimeline(g, SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var most int64
	for _, p := range tl {
		most = max(most, p.Max)
	}
	if most+r.peak.Resident > r.peak.Bytes || most == 0 {
		t.Errorf("timeline's most %d + resident %d does not fit the peak %d", most, r.peak.Resident, r.peak.Bytes)
	}
	if est, err := ExecutorEstimate(g); err != nil || est <= 0 {
		t.Errorf("ExecutorEstimate: %d, %v", est, err)
	}
	t.Logf("training step: %+v (peak at executor node %d)", r.peak, r.peakNode)
}

func TestSimulateErrors(t *testing.T) {
	if _, err := SimulatePeak(nil, SimOptions{}); !errors.Is(err, ErrNotCompiled) {
		t.Errorf("nil graph: %v", err)
	}
	g := graph.NewGraph(gtest.Backend(t), "uncompiled")
	graph.Neg(graph.Parameter(g, "x", f32(2)))
	if _, err := SimulatePeak(g, SimOptions{}); !errors.Is(err, ErrNotCompiled) {
		t.Errorf("uncompiled graph: %v", err)
	}
	g = compileGraph(t, "", []shapes.Shape{f32(2)}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.Neg(p[0])}
	})
	if _, err := SimulatePeak(g, SimOptions{Donate: []bool{true, true}}); err == nil || !strings.Contains(err.Error(), "Donate") {
		t.Errorf("wrong Donate length: %v", err)
	}
	g.Finalize()
	if _, err := SimulatePeak(g, SimOptions{}); !errors.Is(err, ErrNotCompiled) {
		t.Errorf("finalized graph: %v", err)
	}

	gp := compileGraph(t, "go:ops_parallel", []shapes.Shape{f32(2)}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.Neg(p[0])}
	})
	if _, err := SimulatePeak(gp, SimOptions{}); err == nil || !strings.Contains(err.Error(), "parallel") {
		t.Errorf("parallel backend: %v", err)
	}
	// x (8 bytes) resident, Neg a new 8-byte buffer.
	if p, err := SimulatePeak(gp, SimOptions{AssumeSequential: true}); err != nil || p.Bytes != 16 {
		t.Errorf("parallel backend, AssumeSequential: %+v, %v", p, err)
	}

	// Sort runs a comparator closure over the data: refused.
	gs := compileGraph(t, "", []shapes.Shape{f32(8)}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.Sort(p[0], 0, true)}
	})
	if _, err := SimulatePeak(gs, SimOptions{}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Sort graph: %v, want ErrUnsupported", err)
	}

	if _, err := XLAProgramPeak(gp); err == nil {
		t.Errorf("XLAProgramPeak of a Go backend graph did not fail")
	} else if !engine.XLALinked && !errors.Is(err, ErrNoXLA) {
		t.Errorf("XLAProgramPeak without the xla tag: %v, want ErrNoXLA", err)
	}
}

// fakeCounter is a PoolCounter driven by the test.
type fakeCounter struct{ live, peak int64 }

func (f *fakeCounter) Live() int64 { return f.live }
func (f *fakeCounter) Peak() int64 { return f.peak }
func (f *fakeCounter) ResetPeak()  { f.peak = f.live }
func (f *fakeCounter) add(b int64) {
	f.live += b
	f.peak = max(f.peak, f.live)
}

func TestMeasurePeak(t *testing.T) {
	g := compileGraph(t, "", []shapes.Shape{f32(256)}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.Add(graph.Exp(p[0]), graph.Const(g, make([]float32, 256)))}
	})
	x := gtest.Tensor(gtest.Rand(1, 256, 1), 256)
	runs := 0
	run := func() error {
		runs++
		for _, o := range g.Run(x) {
			o.MustFinalizeAll()
		}
		return nil
	}
	// No counter: the simulation (x resident + Exp's buffer, reused by Add; the constant is resident).
	p, err := MeasurePeak(g, run)
	if err != nil || runs != 1 {
		t.Fatalf("MeasurePeak: %v (runs %d)", err, runs)
	}
	if p.Method != MethodSimulation || p.Bytes != 3*1024 || p.Resident != 2*1024 {
		t.Errorf("without counter: %+v", p)
	}

	// A counter: 5000 bytes alive before; the run transfers x (1024), peaks with one intermediate and leaves x
	// and the output (1024) behind.
	c := &fakeCounter{live: 5000}
	SetPoolCounter(c)
	defer SetPoolCounter(nil)
	p, err = MeasurePeak(g, func() error {
		c.add(1024) // x transferred
		c.add(1024) // Exp, reused by Add: the output
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// constants (1024) are not counted by the counter: added to both.
	if p.Method != MethodPoolCounter || p.Bytes != 5000+2048+1024 || p.Resident != 5000+1024+1024 {
		t.Errorf("with counter: %+v", p)
	}
	// Outputs released inside run: resident falls back to what was alive before.
	p, _ = MeasurePeak(g, func() error { c.live = 0; return nil })
	if p.Resident != 7048+1024 {
		t.Errorf("outputs released: %+v", p)
	}

	if _, err := MeasurePeak(g, func() error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("panicking run: %v", err)
	}
	if _, err := MeasurePeak(g, func() error { return errors.New("failed") }); err == nil || !strings.Contains(err.Error(), "failed") {
		t.Errorf("failing run: %v", err)
	}
	if _, err := MeasurePeak(g, nil); err == nil {
		t.Errorf("nil run accepted")
	}
}

// TestSimulateLaterRuns: the simulation models the next execution, and two things change after a graph's first
// one: a large product's packed panels of a constant operand are held by the graph (resident, no longer taken:
// the same peak), and the SIMD int64 ReduceMax has cached the generic executor (no more leaked output: the peak
// and resident bytes drop by it).
func TestSimulateLaterRuns(t *testing.T) {
	const seq1 = "go:ops_sequential,parallelism=1"
	for _, c := range []struct {
		name  string
		param shapes.Shape
		input *tensors.Tensor
		build func(g *graph.Graph, p []*graph.Node) []*graph.Node
		kept  int64 // in the first run
		held  bool  // kept by the graph after the first run (else leaked by it)
	}{
		{"constant-rhs", f32(256, 128), gtest.Tensor(gtest.Rand(3, 256*128, 1), 256, 128),
			func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				w := make([][]float32, 128)
				for i := range w {
					w[i] = gtest.Rand(uint64(i), 128, 1)
				}
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, graph.Const(g, w), []int{0}, nil)}
			}, 65536, true},
		{"int64-reducemax", shapes.Make(dtypes.Int64, 64, 16),
			tensors.FromFlatDataAndDimensions(make([]int64, 64*16), 64, 16),
			func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.ReduceMax(p[0], 1)}
			}, map[bool]int64{true: 512, false: 0}[goBackendEnv().simdExecutors], false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := compileGraph(t, seq1, []shapes.Shape{c.param}, c.build)
			first := mustSim(t, g, SimOptions{})
			if first.kept != c.kept || first.peak.Kept != c.kept {
				t.Errorf("first run keeps %d bytes, want %d", first.kept, c.kept)
			}
			for range 2 {
				for _, o := range g.Run(c.input) {
					o.MustFinalizeAll()
				}
			}
			later := mustSim(t, g, SimOptions{})
			want := first.peak
			want.Kept = 0
			if !c.held {
				want.Bytes, want.Resident = want.Bytes-c.kept, want.Resident-c.kept
			}
			if later.kept != 0 || later.peak != want {
				t.Errorf("after running: %+v (kept %d), want %+v with nothing kept (first run %+v)", later.peak,
					later.kept, want, first.peak)
			}
			x := mustRead(t, g)
			for _, n := range x.nodes {
				if n.op != compute.OpTypeParameter && n.op != compute.OpTypeConstant && n.cachedExecutor == 0 {
					t.Errorf("node #%d (%s) cached no executor after running", n.idx, n.op)
				}
				if n.dot != nil && c.held && n.dot.rhsCache.held != c.kept {
					t.Errorf("the product's RHS cache holds %d bytes, want %d", n.dot.rhsCache.held, c.kept)
				}
			}
			if gb, err := HeldByGraph(g); err != nil || gb.PackedPanels != map[bool]int64{true: c.kept}[c.held] ||
				gb.Constants != x.constantBytes() {
				t.Errorf("HeldByGraph: %+v, %v", gb, err)
			}
			c.input.MustFinalizeAll()
		})
	}
}
