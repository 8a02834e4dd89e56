package memory

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/gobackend"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

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
		g.Compile(build(g, ps)...)
	})
	if err != nil {
		t.Fatalf("building graph: %v", err)
	}
	return g
}

func f32(dims ...int) shapes.Shape { return shapes.Make(dtypes.Float32, dims...) }

func mustSim(t *testing.T, g *graph.Graph, opts SimOptions) simResult {
	t.Helper()
	x, err := readSimpleGo(g)
	if err != nil {
		t.Fatalf("readSimpleGo: %v", err)
	}
	r, err := simulate(x, opts.Donate)
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

// TestSimplegoInternals fails loudly when GoMLX's unexported executor state no longer has the shape memfit reads
// (field names, types, enum values, the DotGeneral split, the data of each node type) or when simplego gains an
// op the simulation does not model.
func TestSimplegoInternals(t *testing.T) {
	for op := range gobackend.Capabilities.Operations {
		if !simModelled(op) && !simBuilderOnly[op] {
			t.Errorf("simplego supports %s, which the simulation does not model: read its executor and add it", op)
		}
	}
	if got := gobackend.DotGeneralTargetBlockLog2Dim[dtypes.Float32]; got != 5 {
		t.Errorf("DotGeneralTargetBlockLog2Dim[float32] = %d, want 5 (blockDim 32)", got)
	}

	g := compileGraph(t, "", []shapes.Shape{f32(3, 4), f32(5, 4), shapes.Make(dtypes.Uint64, graph.RNGStateShape.Dimensions...)},
		func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil) // [3,5]
			s := graph.ReduceSum(y, 1)
			a := graph.ArgMax(y, 1)
			c := graph.Add(s, graph.Const(g, []float32{1, 2, 3}))
			st, r := graph.RandomUniform(p[2], f32(2))
			return []*graph.Node{c, a, st, r}
		})
	x, err := readSimpleGo(g)
	if err != nil {
		t.Fatalf("readSimpleGo: %v", err)
	}
	if !x.sequential {
		t.Errorf("engine's default backend not read as ops_sequential")
	}
	if x.forceDot != dgUnknownProblem {
		t.Errorf("forceDot = %d, want %d", x.forceDot, dgUnknownProblem)
	}
	if len(x.inputs) != 3 || len(x.outputs) != 4 || len(x.numUses) != x.numNodesToProcess {
		t.Fatalf("inputs %v, outputs %v, %d numUses for %d nodes", x.inputs, x.outputs, len(x.numUses), x.numNodesToProcess)
	}
	var dots, reshapesAfterDot, reduces, argmax, consts, rngs int
	for i, n := range x.nodes {
		switch n.op {
		case compute.OpTypeDotGeneral:
			dots++
			d := n.dot
			if d == nil || d.batchSize != 1 || d.lhsCrossSize != 3 || d.rhsCrossSize != 5 || d.contractingSize != 4 ||
				fmt.Sprint(d.lhsContractingAxes, d.rhsContractingAxes) != "[1] [1]" ||
				!d.outputBlockedShape.Equal(shapes.Make(dtypes.Float32, 1, 1, 1, 32, 32)) {
				t.Errorf("DotGeneral data %+v", d)
			}
			if !n.shape.Equal(f32(1, 3, 5)) {
				t.Errorf("normalised DotGeneral shape %s, want [1,3,5]", n.shape)
			}
			if i+1 < len(x.nodes) && x.nodes[i+1].op == compute.OpTypeReshape && fmt.Sprint(x.nodes[i+1].inputs) == fmt.Sprint([]int{i}) {
				reshapesAfterDot++
			}
		case compute.OpTypeReduceSum:
			reduces++
			if !n.hasReduceAxes || fmt.Sprint(n.reduceAxes) != "[1]" {
				t.Errorf("ReduceSum axes %v (found %v)", n.reduceAxes, n.hasReduceAxes)
			}
		case compute.OpTypeArgMinMax:
			argmax++
			if n.argAxis != 1 {
				t.Errorf("ArgMinMax axis %d, want 1", n.argAxis)
			}
		case compute.OpTypeConstant:
			consts++
		case compute.OpTypeRNGBitGenerator:
			if len(n.multiShapes) == 2 {
				rngs++
				for j, m := range n.multiNodes {
					if m <= i || !x.nodes[m].shape.Equal(n.multiShapes[j]) {
						t.Errorf("RNG output %d: node #%d shaped %s, want after #%d and shaped %s", j, m, x.nodes[m].shape, i, n.multiShapes[j])
					}
				}
			}
		}
	}
	if dots != 1 || reshapesAfterDot != 1 || reduces != 1 || argmax != 1 || consts < 1 || rngs != 1 {
		t.Errorf("found %d DotGeneral (%d followed by their Reshape), %d ReduceSum, %d ArgMinMax, %d constants, %d RNG",
			dots, reshapesAfterDot, reduces, argmax, consts, rngs)
	}
	// Uses: each output once, plus each consumer.
	total := 0
	for _, u := range x.numUses {
		total += u
	}
	if total < len(x.outputs)+len(x.inputs) {
		t.Errorf("numUses sum %d looks wrong", total)
	}
	mustSim(t, g, SimOptions{})

	for spec, want := range map[string]struct {
		seq   bool
		force int
	}{
		"go:ops_sequential,dotgeneral_small": {true, dgSmallProblem},
		"go:ops_sequential,dotgeneral_large": {true, dgLargeProblem},
		"go:ops_sequential,dotgeneral_check": {true, dgCheckProblem},
		"go:ops_parallel":                    {false, dgUnknownProblem},
	} {
		g := compileGraph(t, spec, []shapes.Shape{f32(2)}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			return []*graph.Node{graph.Neg(p[0])}
		})
		x, err := readSimpleGo(g)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		if x.sequential != want.seq || x.forceDot != want.force {
			t.Errorf("%s: read sequential=%v forceDot=%d, want %v %d", spec, x.sequential, x.forceDot, want.seq, want.force)
		}
	}
}

// TestSimulateHandComputed checks the simulation against peaks worked out by hand from simplego's executor.
func TestSimulateHandComputed(t *testing.T) {
	const v = 256 * 4 // bytes of a [256] float32
	cases := []struct {
		name          string
		spec          string
		params        []shapes.Shape
		donate        []bool
		build         func(g *graph.Graph, p []*graph.Node) []*graph.Node
		bytes, resid  int64
		outputs       int64
		wantNodeCount int // executor nodes, 0: don't check
	}{
		{
			// Exp allocates (x is used again), Neg and Add reuse it: x + one buffer.
			name: "unary-binary-reuse", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(graph.Neg(graph.Exp(p[0])), p[0])}
			},
			bytes: 2 * v, resid: v, outputs: v, wantNodeCount: 4,
		},
		{
			// Donated x: Exp still allocates (x has another use), Add takes x's buffer (rhs first) and frees e.
			name: "donated", params: []shapes.Shape{f32(256)}, donate: []bool{true},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Add(graph.Neg(graph.Exp(p[0])), p[0])}
			},
			bytes: 2 * v, resid: 0, outputs: v,
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
			// Two live intermediates: a = Exp(x) and b = Sin(x) are both live when Mul runs, which reuses b.
			name: "two-live", params: []shapes.Shape{f32(256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.Mul(graph.Exp(p[0]), graph.Sin(p[0]))}
			},
			bytes: 3 * v, resid: v, outputs: v,
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
			// Small DotGeneral path, both operands transposed into scratch buffers: lhs [8,4] and rhs [8,5]
			// contracted on axis 0. Output [1,4,5] (the Reshape reuses it). 128 + 160 inputs, 80 output, 128 + 160
			// scratch.
			name: "dot-small-transposed", params: []shapes.Shape{f32(8, 4), f32(8, 5)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{0}, nil, p[1], []int{0}, nil)}
			},
			bytes: 288 + 80 + 288, resid: 288, outputs: 80, wantNodeCount: 4,
		},
		{
			// The same product with operands already in [cross, contracting] order: no scratch.
			name: "dot-small-normalized", params: []shapes.Shape{f32(4, 8), f32(5, 8)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil)}
			},
			bytes: 288 + 80, resid: 288, outputs: 80,
		},
		{
			// bfloat16 small path: a float32 accumulator [1,4,5] (80 bytes) besides the bf16 output (40).
			name: "dot-small-bf16", params: []shapes.Shape{shapes.Make(dtypes.BFloat16, 4, 8), shapes.Make(dtypes.BFloat16, 5, 8)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil)}
			},
			bytes: 144 + 40 + 80, resid: 144, outputs: 40,
		},
		{
			// Large path: 200*100 crosses > 16*32*32. Inputs 51200 + 25600, output 80000, blocked lhs
			// [1,7,2,32,32] 57344, rhs [1,4,2,32,32] 32768, output [1,7,4,32,32] 114688.
			name: "dot-large", params: []shapes.Shape{f32(200, 64), f32(100, 64)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil)}
			},
			bytes: 76800 + 80000 + 57344 + 32768 + 114688, resid: 76800, outputs: 80000,
		},
		{
			// The same forced onto the small path by the backend option: no scratch (already normalised).
			name: "dot-forced-small", spec: "go:ops_sequential,dotgeneral_small", params: []shapes.Shape{f32(200, 64), f32(100, 64)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], []int{1}, nil, p[1], []int{1}, nil)}
			},
			bytes: 76800 + 80000, resid: 76800, outputs: 80000,
		},
		{
			// ArgMax over axis 0 of [64,16]: int32 output [16] (64 bytes) + scratch of 16 floats and 16 int32.
			name: "argmax", params: []shapes.Shape{f32(64, 16)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.ArgMax(p[0], 0, dtypes.Int32)}
			},
			bytes: 4096 + 64 + 64 + 64, resid: 4096, outputs: 64,
		},
		{
			// A constant is resident (outside the pool) and, as an output, cloned.
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
			x, err := readSimpleGo(g)
			if err != nil {
				t.Fatal(err)
			}
			if c.wantNodeCount > 0 && len(x.nodes) != c.wantNodeCount {
				var ops []string
				for _, n := range x.nodes {
					ops = append(ops, n.op.String())
				}
				t.Errorf("%d executor nodes (%s), want %d", len(x.nodes), strings.Join(ops, ", "), c.wantNodeCount)
			}
			r := mustSim(t, g, SimOptions{Donate: c.donate})
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
		in += shapeBytes(s)
	}
	out = 4 + shapeBytes(params[1]) + shapeBytes(params[2]) + shapeBytes(params[3]) + shapeBytes(params[4])
	x, _ := readSimpleGo(g)
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
	if r.peak.Resident-d.peak.Resident != shapeBytes(params[0]) {
		t.Errorf("donating x changed resident by %d, want %d", r.peak.Resident-d.peak.Resident, shapeBytes(params[0]))
	}
	if d.peak.Bytes > r.peak.Bytes {
		t.Errorf("donating x raised the peak: %d > %d", d.peak.Bytes, r.peak.Bytes)
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
	if p, err := SimulatePeak(gp, SimOptions{AssumeSequential: true}); err != nil || p.Bytes != 16 {
		t.Errorf("parallel backend, AssumeSequential: %+v, %v", p, err)
	}

	if _, err := XLAProgramPeak(gp); err == nil {
		t.Errorf("XLAProgramPeak of a simplego graph did not fail")
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
	// constants (1024) are outside the pool: added to both.
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
