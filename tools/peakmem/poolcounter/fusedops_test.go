package poolcounter_test

import (
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// The agreement cases of the fused ops and newer executors memfit uses or may use on the pure-Go backend
// (compute v0.1.14): each graph is run cold and warm on a parallelism=1 backend and the simulation must equal
// the pool counter to the byte (see checkAgreement).

// TestAgreementFusedActivation: FusedActivation and FusedActivationVJP (GELU and SiLU, the activations
// approxbp's layers run fused), with owned and unowned inputs around them.
func TestAgreementFusedActivation(t *testing.T) {
	for _, act := range []compute.ActivationType{compute.ActivationGelu, compute.ActivationSilu} {
		cfg := compute.ActivationConfig{Type: act}
		agree(t, stepCase{name: "fused-activation-" + act.String(), spec: one1,
			params: []shapes.Shape{f32(64, 256), f32(64, 256)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				x, dOut := p[0], p[1]
				h := graph.MulScalar(x, 1.5)
				y := graph.BackendFusedActivation(h, cfg)
				dx := graph.BackendFusedActivationVJP(y, h, dOut, cfg)
				e := graph.Exp(x)
				dx2 := graph.BackendFusedActivationVJP(graph.BackendFusedActivation(e, cfg), e, graph.Neg(dOut), cfg)
				return []*graph.Node{graph.ReduceAllSum(y), dx, dx2}
			}})
	}
}

// TestAgreementFusedDense: FusedDense (bias, activation, both weight layouts) and FusedDenseVJP (for the
// activations whose gradient comes from the output, which is all it accepts), with products on both sides of
// the large-path threshold (256x128x256 = 8 Mi multiply-adds takes the large kernel and its panels, 32x64x48
// the small one), and a constant weight, whose packed panels the first large run keeps.
func TestAgreementFusedDense(t *testing.T) {
	for _, c := range []struct {
		name              string
		rows, in, out     int
		layout            compute.DenseLayout
		act               compute.ActivationType
		bias, constWeight bool
	}{
		{"large-io-gelu-bias", 256, 128, 256, compute.DenseLayoutInputOutputs, compute.ActivationGelu, true, false},
		{"large-oi-nobias", 256, 128, 256, compute.DenseLayoutOutputsInput, compute.ActivationNone, false, false},
		{"large-io-tanh-bias", 256, 128, 256, compute.DenseLayoutInputOutputs, compute.ActivationTanh, true, false},
		{"small-io-silu-bias", 32, 64, 48, compute.DenseLayoutInputOutputs, compute.ActivationSilu, true, false},
		{"small-oi-relu", 32, 64, 48, compute.DenseLayoutOutputsInput, compute.ActivationRelu, false, false},
		{"large-const-weight", 256, 128, 256, compute.DenseLayoutInputOutputs, compute.ActivationNone, true, true},
	} {
		wShape := f32(c.in, c.out)
		if c.layout == compute.DenseLayoutOutputsInput {
			wShape = f32(c.out, c.in)
		}
		agree(t, stepCase{name: "fused-dense-" + c.name, spec: one1,
			params: []shapes.Shape{f32(c.rows, c.in), wShape, f32(c.out), f32(c.rows, c.out)},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				x, w, b, dOut := p[0], p[1], p[2], p[3]
				if c.constWeight {
					w = graph.Const(g, randTensor(7, wShape, 0.1).Value())
				}
				if !c.bias {
					b = nil
				}
				cfg := compute.DenseConfig{Activation: compute.ActivationConfig{Type: c.act}, WeightLayout: c.layout}
				y := graph.BackendFusedDense(x, w, b, cfg)
				outs := []*graph.Node{y}
				if !c.constWeight && !c.act.VJPRequiresInput() {
					dx, dw, db := graph.BackendFusedDenseVJP(x, w, b, y, dOut, cfg)
					outs = append(outs, dx, dw)
					if db != nil {
						outs = append(outs, db)
					}
				}
				return outs
			}})
	}
}

// TestAgreementDynamicUpdateSlice: DynamicUpdateSlice into an operand it owns (Exp's result: updated in place)
// and into a parameter (cloned first).
func TestAgreementDynamicUpdateSlice(t *testing.T) {
	agree(t, stepCase{name: "dynamic-update-slice", spec: one1, params: []shapes.Shape{f32(64, 128), f32(16, 128)},
		build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			at := []*graph.Node{graph.Const(g, int32(8)), graph.Const(g, int32(0))}
			inPlace := graph.DynamicUpdateSlice(graph.Exp(p[0]), p[1], at)
			cloned := graph.DynamicUpdateSlice(p[0], graph.Neg(p[1]), at)
			return []*graph.Node{graph.ReduceAllSum(inPlace), cloned}
		}})
}

// TestAgreementFusedNorms: FusedSoftmax over the last axis (the SIMD executor with GOEXPERIMENT=simd) and over
// the first (the generic one), FusedLayerNorm over the trailing axis with gamma and beta and over a leading
// axis without them.
func TestAgreementFusedNorms(t *testing.T) {
	agree(t, stepCase{name: "fused-softmax-layernorm", spec: one1, params: []shapes.Shape{f32(64, 256), f32(256), f32(256)},
		build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			x := p[0]
			sLast := graph.BackendFusedSoftmax(x, 1)
			sFirst := graph.BackendFusedSoftmax(graph.Exp(x), 0)
			ln := graph.BackendFusedLayerNorm(graph.Add(sLast, x), []int{1}, 1e-5, p[1], p[2])
			lnLead := graph.BackendFusedLayerNorm(x, []int{0}, 1e-5, nil, nil)
			return []*graph.Node{ln, graph.ReduceAllSum(sFirst), lnLead}
		}})
}

// TestAgreementFirstRun: what differs between a graph's first run and later ones. A large product with a
// constant operand packs that operand into a pool buffer the graph keeps after the first run; a SIMD
// ReduceMax/ReduceMin on int64 leaks its output buffer on the first run (GOEXPERIMENT=simd only; the node then
// caches the generic executor). The cold run is the first, the warm one the second.
func TestAgreementFirstRun(t *testing.T) {
	agree(t, stepCase{name: "first-run", spec: one1, params: []shapes.Shape{f32(256, 128), shapes.Make(dtypes.Int64, 64, 16)},
		build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			w := graph.Const(g, randTensor(9, f32(128, 192), 0.1).Value())
			prod := engine.DotGeneral(p[0], []int{1}, nil, w, []int{0}, nil) // 256x128x192 = 6 Mi: large
			return []*graph.Node{prod, graph.ReduceMax(p[1], 1), graph.ReduceMin(p[1], 0)}
		}})
}

// TestAgreementSDPA: the Go backend's fused attention (no mask) in both axes layouts.
func TestAgreementSDPA(t *testing.T) {
	for _, layout := range []compute.AttentionAxesLayout{compute.AttentionAxesLayoutBHSD, compute.AttentionAxesLayoutBSHD} {
		s := f32(2, 4, 32, 16) // BHSD [batch, heads, seq, dim]
		if layout == compute.AttentionAxesLayoutBSHD {
			s = f32(2, 32, 4, 16)
		}
		agree(t, stepCase{name: "sdpa-" + layout.String(), spec: one1, params: []shapes.Shape{s, s, s},
			build: func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				o, _ := graph.BackendFusedScaledDotProductAttention(graph.Exp(p[0]), p[1], p[2], layout,
					&compute.ScaledDotProductAttentionConfig{Causal: true})
				return []*graph.Node{o}
			}})
	}
}
