package poolcounter_test

import (
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/tools/peakmem/poolcounter"
)

// TestCounterSane checks the counter itself: transfers and outputs count their bucketed bytes, the peak of a
// small run is the number worked out by hand from the executor, constants are left out, and everything returns
// to the starting value once the tensors are finalized, run after run.
func TestCounterSane(t *testing.T) {
	if !memory.HasPoolCounter() {
		t.Fatal("importing poolcounter did not install the counter")
	}
	var c poolcounter.Counter
	b := backendFor(t, one1)
	settle()
	start := c.Live()

	x := randTensor(1, f32(8, 125), 1) // 4000 bytes, a 4096-byte bucket
	if _, err := x.Buffer(b, 0); err != nil {
		t.Fatal(err)
	}
	if got := c.Live() - start; got != 4096 {
		t.Fatalf("transferring a [8,125] float32 tensor added %d live bytes, want its 4096-byte bucket", got)
	}
	c.ResetPeak()
	if c.Peak() != c.Live() {
		t.Fatalf("after ResetPeak, peak %d != live %d", c.Peak(), c.Live())
	}

	// y = xᵀ·x contracting axis 0 of both: the builder transposes x once (the two Transposes are one node after
	// de-duplication) into [125,8] (4096), the DotGeneral outputs [1,125,125] (62500 bytes -> 65536), the
	// Transpose is released after it (4096 + 65536 held); Reshape and Exp reuse the product. Then ReduceAllSum
	// adds 4 bytes and the constant plus one a new 4096-byte buffer (a constant is never owned): 69636 held.
	g := graph.NewGraph(b, "sane")
	if err := engine.Try(func() {
		p := graph.Parameter(g, "x", x.Shape())
		y := graph.DotGeneral(p, []int{0}, nil, p, []int{0}, nil) // [125,125]
		if err := g.Compile(graph.Exp(y), graph.ReduceAllSum(p), graph.AddScalar(graph.Const(g, make([]float32, 1000)), 1)); err != nil {
			panic(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	defer g.Finalize()
	if got := c.Live(); got != start+4096 {
		t.Fatalf("compiling (a 4000-byte constant) changed the live bytes by %d, want 0", got-start-4096)
	}
	for i := range 3 {
		c.ResetPeak()
		before := c.Live()
		var outs []*tensors.Tensor
		if err := engine.Try(func() { outs = g.Run(x) }); err != nil {
			t.Fatal(err)
		}
		outBytes := int64(65536 + 4 + 4096)
		if got := c.Live() - before; got != outBytes {
			t.Errorf("run %d left %d bytes, want its outputs' %d", i, got, outBytes)
		}
		if got := c.Peak() - before; got != 65536+4+4096 {
			t.Errorf("run %d peaked %d above its start, want %d (the three outputs)", i, got, 65536+4+4096)
		}
		for _, o := range outs {
			o.MustFinalizeAll()
		}
		if got := c.Live(); got != before {
			t.Errorf("run %d: live %d after finalizing outputs, want %d", i, got, before)
		}
	}
	x.MustFinalizeAll()
	if got := c.Live(); got != start {
		t.Errorf("live %d after finalizing everything, want the starting %d", got, start)
	}
}

// The agreement tests: memory.SimulatePeak against the patched pool counter on real training steps. Every case
// asserts exact agreement of peak, resident and transient bytes, for a cold run (inputs transferred inside the
// run) and a warm one (inputs already on the backend), on one1 backends; run with -v to see the figures.

// TestAgreementMLP: a two-layer MLP training step with engine.Linear, Erf-based GELU, an MSE loss and
// engine.Gradient. Its products cross the large-path threshold (4 Mi multiply-adds) both ways: the first layer's
// forward product (64x512x256 = 8 Mi) and its weight gradient take the large path, the second layer's forward
// (64x128x512 = 4 Mi) too, the rest the small one.
func TestAgreementMLP(t *testing.T) {
	agree(t, stepCase{name: "mlp-f32", spec: one1, params: mlpParams(dtypes.Float32, 64, 256, 512, 128), build: mlpStep})
}

// TestAgreementSchedules: the MLP with GoMLX's own default schedule (longest path to an output first, the
// dependency_order option), which the simulation must follow as well as the creation order engine.NewBackend
// configures.
func TestAgreementSchedules(t *testing.T) {
	agree(t, stepCase{name: "mlp-dependency-order", spec: one1 + ",dependency_order",
		params: mlpParams(dtypes.Float32, 64, 256, 512, 128), build: mlpStep})
}

// TestAgreementMatmulPaths: products just under and at the large-path threshold, batched (AVX2 routes on one
// matrix, nosimd and AVX-512 on the batch), with operands the builder must transpose, in float32 and bfloat16.
func TestAgreementMatmulPaths(t *testing.T) {
	for _, c := range []struct {
		name       string
		lhs, rhs   shapes.Shape
		lc, lb     []int
		rc, rb     []int
		transposed bool
	}{
		{"small-255", f32(255, 128), f32(128, 128), []int{1}, nil, []int{0}, nil, false},
		{"large-256", f32(256, 128), f32(128, 128), []int{1}, nil, []int{0}, nil, false},
		{"large-transposed", f32(128, 256), f32(128, 128), []int{0}, nil, []int{1}, nil, true},
		{"batched", f32(4, 64, 128), f32(4, 128, 128), []int{2}, []int{0}, []int{1}, []int{0}, false},
		{"large-bf16", bf16(256, 128), bf16(128, 128), []int{1}, nil, []int{0}, nil, false},
		{"small-bf16", bf16(32, 128), bf16(128, 128), []int{1}, nil, []int{0}, nil, false},
	} {
		agree(t, stepCase{name: "dot-" + c.name, spec: one1, params: []shapes.Shape{c.lhs, c.rhs},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{graph.DotGeneral(p[0], c.lc, c.lb, p[1], c.rc, c.rb)}
			}})
	}
}

// TestAgreementBF16: the MLP in bfloat16 (float32 products converted back, float32 accumulators for the
// bfloat16 sums).
func TestAgreementBF16(t *testing.T) {
	agree(t, stepCase{name: "mlp-bf16", spec: one1, params: mlpParams(dtypes.BFloat16, 32, 128, 256, 64), build: mlpStep})
}

// TestAgreementDonated: the MLP with its batch (x and target) donated to the run.
func TestAgreementDonated(t *testing.T) {
	agree(t, stepCase{name: "mlp-donated", spec: one1, params: mlpParams(dtypes.Float32, 64, 128, 256, 32),
		donate: []bool{true, true, false, false, false, false}, build: mlpStep})
}

// attentionStep: scores = q·kᵀ over batch axes (batch, head), softmax, probs·v (v contracted on its token axis,
// which the builder transposes), loss = Σ out·w, gradients for q, k and v. The softmax is memfit's
// (attention.Softmax): engine.Gradient cannot differentiate graph.Softmax's fused op, whose gradient GoMLX takes
// from a decomposed alternate it does not export.
func attentionStep(g *graph.Graph, p []*graph.Node) []*graph.Node {
	q, k, v, w := p[0], p[1], p[2], p[3]
	d := q.Shape().Dimensions[3]
	scores := graph.MulScalar(engine.DotGeneral(q, []int{3}, []int{0, 1}, k, []int{3}, []int{0, 1}), 1/float64(d))
	probs := attention.Softmax(scores)
	out := engine.DotGeneral(probs, []int{3}, []int{0, 1}, v, []int{2}, []int{0, 1})
	loss := graph.ReduceAllSum(graph.Mul(out, w))
	return append([]*graph.Node{loss}, engine.Gradient(loss, q, k, v)...)
}

// TestAgreementAttention: the attention-like chain at 64 tokens (every product on the small path, with merged
// batch axes and transposed operands) and at 256 tokens (the T×T products on the large path).
func TestAgreementAttention(t *testing.T) {
	for _, tc := range []struct {
		name          string
		b, h, tok, dh int
	}{{"attention-small", 2, 4, 64, 32}, {"attention-large", 2, 2, 256, 32}} {
		s := f32(tc.b, tc.h, tc.tok, tc.dh)
		agree(t, stepCase{name: tc.name, spec: one1, params: []shapes.Shape{s, s, s, s}, build: attentionStep})
	}
}

// TestAgreementMiscOps: the other executors with their own buffer rules: Where, ArgMinMax (scratch buffers),
// RNGBitGenerator (two outputs, state reused), Gather and its Scatter gradient, Concatenate, Slice, Transpose,
// ReduceMax, ConvertDType, OptimizationBarrier, a bfloat16 ReduceSum (float32 accumulator) and a bfloat16
// ArgMax.
func TestAgreementMiscOps(t *testing.T) {
	agree(t, stepCase{name: "misc-ops", spec: one1, params: []shapes.Shape{f32(64, 48), f32(48, 32), bf16(16, 40)},
		build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			x, w, hb := p[0], p[1], p[2]
			state, noise := graph.RandomUniform(graph.RNGStateFromSeedForGraph(g, 7), x.Shape())
			leaky := graph.Where(graph.GreaterThan(x, graph.ZerosLike(x)), x, graph.MulScalar(x, 0.1))
			h := engine.Linear(graph.Add(leaky, noise), graph.TransposeAllAxes(w, 1, 0), nil) // [64,32]
			h = graph.OptimizationBarrier(h)
			arg := graph.ConvertDType(graph.ArgMax(h, 1), dtypes.Float32)          // [64]
			rows := graph.Gather(h, graph.Const(g, [][]int32{{3}, {5}, {7}, {3}})) // [4,32]
			cat := graph.Concatenate([]*graph.Node{h, rows}, 0)                    // [68,32]
			sl := engine.Slice(cat, []int{2, 0}, []int{66, 16})
			loss := graph.Add(graph.ReduceAllSum(graph.Square(sl)), graph.ReduceAllMax(h))
			grads := engine.Gradient(loss, x, w)
			hsum := graph.ReduceSum(graph.Exp(hb), 1) // bfloat16 [16]
			harg := graph.ArgMin(hb, 0, dtypes.Int32) // [40]
			seen := map[graph.NodeType]bool{}
			for _, n := range g.Nodes() {
				seen[n.Type()] = true
			}
			for _, nt := range []graph.NodeType{graph.NodeTypeWhere, graph.NodeTypeArgMinMax, graph.NodeTypeRNGBitGenerator,
				graph.NodeTypeGather, graph.NodeTypeScatterSum, graph.NodeTypeConcatenate, graph.NodeTypeSlice,
				graph.NodeTypeTranspose, graph.NodeTypeReduceMax, graph.NodeTypeConvertDType,
				graph.NodeTypeOptimizationBarrier} {
				if !seen[nt] {
					t.Errorf("misc-ops graph has no %s node", nt)
				}
			}
			return []*graph.Node{loss, grads[0], grads[1], arg, state, hsum, harg}
		}})
}

// checkBounds runs the case on the engine's default backend (several workers for the large matrix product)
// and checks that the counter lies between the simulation with one worker holding panels and the simulation's
// default upper bound (every worker the pool can start), for a few runs.
func checkBounds(t *testing.T, c stepCase) {
	t.Helper()
	c.spec = engineDefault
	g := compileCase(t, c)
	defer g.Finalize()
	sims := func() (upper, lower memory.Peak) {
		var err error
		if upper, err = memory.SimulatePeak(g, memory.SimOptions{}); err != nil {
			t.Fatal(err)
		}
		if lower, err = memory.SimulatePeak(g, memory.SimOptions{MatmulWorkers: 1}); err != nil {
			t.Fatal(err)
		}
		return upper, lower
	}
	args := make([]*tensors.Tensor, len(c.params))
	for i, s := range c.params {
		args[i] = randTensor(uint64(200+i), s, 0.5)
	}
	defer func() {
		for _, a := range args {
			a.MustFinalizeAll()
		}
	}()
	var seen []int64
	var upper, lower memory.Peak
	for range 5 {
		upper, lower = sims()
		got := warmTransient(t, c.name, g, args, upper.Kept)
		seen = append(seen, got)
		if got < lower.Transient() || got > upper.Transient() {
			t.Errorf("%s: counter transient %d outside the simulation's [%d (one worker), %d (all workers)]",
				c.name, got, lower.Transient(), upper.Transient())
		}
	}
	t.Logf("%-20s default workers pool: counter transients %v, simulation %d (one worker) .. %d (upper bound)",
		c.name, seen, lower.Transient(), upper.Transient())
}

// TestBoundsDefaultParallelism: on the engine's default backend the large product's panels are held by as many
// workers as goroutine scheduling lets start, so the simulation is an upper bound; check it and its one-worker
// lower figure against the counter.
func TestBoundsDefaultParallelism(t *testing.T) {
	checkBounds(t, stepCase{name: "mlp-f32", params: mlpParams(dtypes.Float32, 64, 256, 512, 128), build: mlpStep})
	s := f32(2, 2, 256, 32)
	checkBounds(t, stepCase{name: "attention-large", params: []shapes.Shape{s, s, s, s}, build: attentionStep})
}
