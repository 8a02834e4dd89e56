package poolcounter_test

import (
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/tools/peakmem/poolcounter"
)

// TestCounterSane checks the counter itself: transfers and outputs count their exact bytes, the peak of a run
// lies above what it leaves behind, and everything returns to the starting value once the tensors are finalized,
// run after run (DotGeneral's transposed copies, which simplego never puts back, do not accumulate).
func TestCounterSane(t *testing.T) {
	if !memory.HasPoolCounter() {
		t.Fatal("importing poolcounter did not install the counter")
	}
	var c poolcounter.Counter
	b := backendFor(t, "go")
	settle()
	start := c.Live()

	x := randTensor(1, f32(8, 125), 1) // 4000 bytes
	if _, err := x.Buffer(b, 0); err != nil {
		t.Fatal(err)
	}
	if got := c.Live() - start; got != 4000 {
		t.Fatalf("transferring a [8,125] float32 tensor added %d live bytes, want 4000", got)
	}
	c.ResetPeak()
	if c.Peak() != c.Live() {
		t.Fatalf("after ResetPeak, peak %d != live %d", c.Peak(), c.Live())
	}

	// y = xᵀ·x-like product contracting axis 0 of both: both operands need the small path's transposed copies.
	g := graph.NewGraph(b, "sane")
	if err := engine.Try(func() {
		p := graph.Parameter(g, "x", x.Shape())
		y := graph.DotGeneral(p, []int{0}, nil, p, []int{0}, nil) // [125,125]
		g.Compile(graph.Exp(y), graph.ReduceAllSum(p))
	}); err != nil {
		t.Fatal(err)
	}
	defer g.Finalize()
	for i := range 3 {
		c.ResetPeak()
		before := c.Live()
		var outs []*tensors.Tensor
		if err := engine.Try(func() { outs = g.Run(x) }); err != nil {
			t.Fatal(err)
		}
		outBytes := int64(125*125*4 + 4)
		if got := c.Live() - before; got != outBytes {
			t.Errorf("run %d left %d bytes, want its outputs' %d", i, got, outBytes)
		}
		// Peak above x: the product's output and both transposed copies (4000 bytes each); Reshape and Exp reuse
		// the output, ReduceAllSum's 4 bytes come after the copies are released.
		if got := c.Peak() - before; got != 125*125*4+8000 {
			t.Errorf("run %d peaked %d above its start, want %d", i, got, 125*125*4+8000)
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
// run) and a warm one (inputs already on the backend); run with -v to see the figures.

// TestAgreementMLP: a two-layer MLP training step with engine.Linear, Erf-based GELU, an MSE loss and
// engine.Gradient. Sizes cross the DotGeneral threshold both ways: the first layer's forward product
// (64x512 crosses) and the weight gradients take the large path, the second layer's forward the small one.
func TestAgreementMLP(t *testing.T) {
	c := stepCase{name: "mlp-f32", spec: "go", params: mlpParams(dtypes.Float32, 64, 256, 512, 128), build: mlpStep}
	assertAgree(t, c.name, checkAgreement(t, c))
}

// TestAgreementDotPaths: the same MLP with DotGeneral forced onto the small path, the large path, and the
// check mode (both paths plus a second output buffer).
func TestAgreementDotPaths(t *testing.T) {
	for _, opt := range []string{"dotgeneral_small", "dotgeneral_large", "dotgeneral_check"} {
		c := stepCase{name: "mlp-" + opt, spec: "go:ops_sequential," + opt,
			params: mlpParams(dtypes.Float32, 32, 96, 160, 48), build: mlpStep}
		assertAgree(t, c.name, checkAgreement(t, c))
	}
}

// TestAgreementBF16: the MLP in bfloat16 (float32 accumulators on the small path, float32 blocked output on the
// large one).
func TestAgreementBF16(t *testing.T) {
	c := stepCase{name: "mlp-bf16", spec: "go", params: mlpParams(dtypes.BFloat16, 32, 128, 256, 64), build: mlpStep}
	assertAgree(t, c.name, checkAgreement(t, c))
}

// TestAgreementDonated: the MLP with its batch (x and target) donated to the run.
func TestAgreementDonated(t *testing.T) {
	c := stepCase{name: "mlp-donated", spec: "go", params: mlpParams(dtypes.Float32, 64, 128, 256, 32),
		donate: []bool{true, true, false, false, false, false}, build: mlpStep}
	assertAgree(t, c.name, checkAgreement(t, c))
}

// attentionStep: scores = q·kᵀ over batch axes (batch, head), softmax, probs·v (v contracted on its token axis,
// which needs a transposed copy on the small path), loss = Σ out·w, gradients for q, k and v.
func attentionStep(g *graph.Graph, p []*graph.Node) []*graph.Node {
	q, k, v, w := p[0], p[1], p[2], p[3]
	d := q.Shape().Dimensions[3]
	scores := graph.MulScalar(engine.DotGeneral(q, []int{3}, []int{0, 1}, k, []int{3}, []int{0, 1}), 1/float64(d))
	probs := graph.Softmax(scores, -1)
	out := engine.DotGeneral(probs, []int{3}, []int{0, 1}, v, []int{2}, []int{0, 1})
	loss := graph.ReduceAllSum(graph.Mul(out, w))
	return append([]*graph.Node{loss}, engine.Gradient(loss, q, k, v)...)
}

// TestAgreementAttention: the attention-like chain at 64 tokens (every product on the small path, with batch
// axes and transposed copies) and at 160 tokens (the T×T products on the large path).
func TestAgreementAttention(t *testing.T) {
	for _, tc := range []struct {
		name          string
		b, h, tok, dh int
	}{{"attention-small", 2, 4, 64, 32}, {"attention-large", 2, 2, 160, 16}} {
		s := f32(tc.b, tc.h, tc.tok, tc.dh)
		c := stepCase{name: tc.name, spec: "go", params: []shapes.Shape{s, s, s, s}, build: attentionStep}
		assertAgree(t, c.name, checkAgreement(t, c))
	}
}

// TestAgreementMiscOps: the other executors with their own buffer rules: Where, ArgMinMax (scratch buffers),
// RNGBitGenerator (two outputs, state reused), Gather and its Scatter gradient, Concatenate, Slice, Transpose,
// ReduceMax, ConvertDType.
func TestAgreementMiscOps(t *testing.T) {
	c := stepCase{name: "misc-ops", spec: "go", params: []shapes.Shape{f32(64, 48), f32(48, 32)},
		build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			x, w := p[0], p[1]
			state, noise := graph.RandomUniform(graph.RNGStateFromSeedForGraph(g, 7), x.Shape())
			leaky := graph.Where(graph.GreaterThan(x, graph.ZerosLike(x)), x, graph.MulScalar(x, 0.1))
			h := engine.Linear(graph.Add(leaky, noise), graph.TransposeAllAxes(w, 1, 0), nil) // [64,32]
			arg := graph.ConvertDType(graph.ArgMax(h, 1), dtypes.Float32)                     // [64]
			rows := graph.Gather(h, graph.Const(g, [][]int32{{3}, {5}, {7}, {3}}))            // [4,32]
			cat := graph.Concatenate([]*graph.Node{h, rows}, 0)                               // [68,32]
			sl := engine.Slice(cat, []int{2, 0}, []int{66, 16})
			loss := graph.Add(graph.ReduceAllSum(graph.Square(sl)), graph.ReduceAllMax(h))
			grads := engine.Gradient(loss, x, w)
			seen := map[graph.NodeType]bool{}
			for _, n := range g.Nodes() {
				seen[n.Type()] = true
			}
			for _, nt := range []graph.NodeType{graph.NodeTypeWhere, graph.NodeTypeArgMinMax, graph.NodeTypeRNGBitGenerator,
				graph.NodeTypeGather, graph.NodeTypeScatterSum, graph.NodeTypeConcatenate, graph.NodeTypeSlice,
				graph.NodeTypeTranspose, graph.NodeTypeReduceMax, graph.NodeTypeConvertDType} {
				if !seen[nt] {
					t.Errorf("misc-ops graph has no %s node", nt)
				}
			}
			return []*graph.Node{loss, grads[0], grads[1], arg, state}
		}}
	assertAgree(t, c.name, checkAgreement(t, c))
}
