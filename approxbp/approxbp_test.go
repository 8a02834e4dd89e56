package approxbp_test

import (
	"math"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/approxbp"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
)

// probeInputs covers all four segments of the k=2 step functions of both activations, the breakpoints
// themselves, values just beside them, zeros and far tails.
func probeInputs(c approxbp.Coefficients) []float32 {
	xs := []float32{0, -0, 1e-8, -1e-8, 50, -50, 1e4, -1e4}
	for _, ci := range c.C {
		b := float32(ci)
		xs = append(xs, b, math.Nextafter32(b, 100), math.Nextafter32(b, -100), b+0.25, b-0.25)
	}
	xs = append(xs, gtest.Rand(7, 4096-len(xs), 4)...)
	return xs
}

type variant struct {
	name   string
	act    approxbp.Activation
	coeffs approxbp.Coefficients
	exact  func(*graph.Node) *graph.Node
	approx func(*graph.Node) *graph.Node
	ref    func(float64) float64
}

var variants = []variant{
	{"gelu", approxbp.ActGELU, approxbp.ReGELU2Coefficients, approxbp.GELU, approxbp.ReGELU2, approxbp.GELU64},
	{"silu", approxbp.ActSiLU, approxbp.ReSiLU2Coefficients, approxbp.SiLU, approxbp.ReSiLU2, approxbp.SiLU64},
	{"gelu_pytorch_tanh", approxbp.ActGELUTanh, approxbp.ReGELU2TanhCoefficients, approxbp.GELUTanh, approxbp.ReGELU2Tanh, approxbp.GELUTanh64},
}

// withFusion pairs every variant with GOMLX_FUSION=1 (the pure-Go backend's fused GELU) and 0 (plain ops, what
// backends without one build).
func withFusion[T any](vs []T) []struct {
	variant T
	fusion  string
} {
	var out []struct {
		variant T
		fusion  string
	}
	for _, f := range []string{"1", "0"} {
		for _, v := range vs {
			out = append(out, struct {
				variant T
				fusion  string
			}{v, f})
		}
	}
	return out
}

// TestForwardIsExact: the approximate activations' forward equals the exact activation bit for bit, and the
// exact activation matches the float64 reference.
func TestForwardIsExact(t *testing.T) {
	for _, vf := range withFusion(variants) {
		vr := vf.variant
		t.Run(vr.name+"/fusion="+vf.fusion, func(t *testing.T) {
			t.Setenv(graph.FusionEnv, vf.fusion)
			xs := probeInputs(vr.coeffs)
			x := gtest.Tensor(xs, 64, 64)
			out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return []*graph.Node{vr.exact(p[0]), vr.approx(p[0])}
			}, x)
			for i := range xs {
				if math.Float32bits(out[0][i]) != math.Float32bits(out[1][i]) {
					t.Fatalf("x=%g: approximate forward %g (bits %x) != exact %g (bits %x)", xs[i], out[1][i],
						math.Float32bits(out[1][i]), out[0][i], math.Float32bits(out[0][i]))
				}
				want := vr.ref(float64(xs[i]))
				if d := math.Abs(float64(out[0][i]) - want); d > 1e-6*math.Max(1, math.Abs(want)) {
					t.Fatalf("x=%g: %s = %g, float64 reference %g", xs[i], vr.name, out[0][i], want)
				}
			}
		})
	}
}

// TestApproxGradientIsStep: the gradient is upstream times the step slope Levels[code(x)] (within 1e-6), for
// every segment.
func TestApproxGradientIsStep(t *testing.T) {
	for _, vr := range variants {
		t.Run(vr.name, func(t *testing.T) {
			xs := probeInputs(vr.coeffs)
			vs := gtest.Rand(8, len(xs), 1)
			out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				y := vr.approx(p[0])
				return engine.Gradient(graph.ReduceAllSum(graph.Mul(y, p[1])), p[0])
			}, gtest.Tensor(xs, 64, 64), gtest.Tensor(vs, 64, 64))
			levels := vr.coeffs.Levels()
			seen := map[int]bool{}
			for i, x := range xs {
				code := code32(vr.coeffs, x)
				seen[code] = true
				want := float64(vs[i]) * levels[code]
				if d := math.Abs(float64(out[0][i]) - want); d > 1e-6 {
					t.Fatalf("x=%g (code %d): grad %g, want %g", x, code, out[0][i], want)
				}
			}
			if len(seen) != 4 {
				t.Fatalf("probe inputs covered codes %v, want all four", seen)
			}
		})
	}
}

// TestExactGradients: the baselines' one-tensor gradients match the float64 derivative.
func TestExactGradients(t *testing.T) {
	derivs := map[string]func(float64) float64{
		"gelu": func(x float64) float64 {
			return 0.5*(1+math.Erf(x/math.Sqrt2)) + x*math.Exp(-x*x/2)/math.Sqrt(2*math.Pi)
		},
		"silu": func(x float64) float64 { s := 1 / (1 + math.Exp(-x)); return s * (1 + x*(1-s)) },
		"gelu_pytorch_tanh": func(x float64) float64 {
			k := math.Sqrt(2 / math.Pi)
			t := math.Tanh(k * (x + 0.044715*x*x*x))
			return 0.5*(1+t) + 0.5*x*(1-t*t)*k*(1+3*0.044715*x*x)
		},
	}
	for _, vf := range withFusion(variants) {
		vr := vf.variant
		t.Run(vr.name+"/fusion="+vf.fusion, func(t *testing.T) {
			t.Setenv(graph.FusionEnv, vf.fusion)
			xs := gtest.Rand(9, 1024, 3)
			out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				return engine.Gradient(graph.ReduceAllSum(vr.exact(p[0])), p[0])
			}, gtest.Tensor(xs, 1024))
			for i, x := range xs {
				want := derivs[vr.name](float64(x))
				if d := math.Abs(float64(out[0][i]) - want); d > 2e-6 {
					t.Fatalf("x=%g: grad %g, want %g", x, out[0][i], want)
				}
			}
		})
	}
}

// TestPackRoundTripAndSize: Pack stores exactly ceil(n / codesPerByte) bytes and Unpack restores the codes, for
// every width and for sizes that do and do not fill the last byte.
func TestPackRoundTripAndSize(t *testing.T) {
	for _, multiply := range []bool{true, false} { // the pure-Go backend's word multiply, and a multiply + sum
		old := approxbp.SetPackByMultiply(multiply)
		testPackRoundTrip(t)
		approxbp.SetPackByMultiply(old)
	}
}

func testPackRoundTrip(t *testing.T) {
	for bits := 1; bits <= 4; bits++ {
		for _, dims := range [][]int{{1}, {3}, {4}, {5}, {7, 3}, {2, 3, 8}, {9, 11}} {
			n := 1
			for _, d := range dims {
				n *= d
			}
			codes := make([]uint8, n)
			for i := range codes {
				codes[i] = uint8((i*7 + 3) % (1 << bits))
			}
			in := tensors.FromFlatDataAndDimensions(codes, dims...)
			var packedSize int
			out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				packed := approxbp.Pack(p[0], bits)
				if packed.DType() != dtypes.Uint8 || packed.Rank() != 1 {
					t.Fatalf("packed has shape %s, want flat uint8", packed.Shape())
				}
				packedSize = packed.Shape().Size()
				return []*graph.Node{approxbp.Unpack(packed, bits, dims...)}
			}, in)
			want := (n + approxbp.CodesPerByte(bits) - 1) / approxbp.CodesPerByte(bits)
			if packedSize != want || packedSize != approxbp.PackedSize(n, bits) {
				t.Errorf("bits=%d n=%d: packed into %d bytes, want %d", bits, n, packedSize, want)
			}
			for i := range codes {
				if out[0][i] != float32(codes[i]) {
					t.Fatalf("bits=%d dims=%v: code %d unpacked as %v, want %d", bits, dims, i, out[0][i], codes[i])
				}
			}
		}
	}
}

// TestPackLayout pins the byte layout of 2-bit codes: element 4j+k sits at bits 2k..2k+1 of byte j.
func TestPackLayout(t *testing.T) {
	codes := []uint8{1, 2, 3, 0, 3, 3, 0, 1, 2}
	want := []float32{1 | 2<<2 | 3<<4 | 0<<6, 3 | 3<<2 | 0<<4 | 1<<6, 2}
	for _, multiply := range []bool{true, false} {
		old := approxbp.SetPackByMultiply(multiply)
		out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			return []*graph.Node{approxbp.Pack(p[0], 2)}
		}, tensors.FromFlatDataAndDimensions(codes, len(codes)))
		approxbp.SetPackByMultiply(old)
		if gtest.MaxAbsDiff(out[0], want) != 0 {
			t.Fatalf("multiply=%v: packed bytes %v, want %v", multiply, out[0], want)
		}
	}
}

// TestApproxKBits runs the general k-bit path with fitted-like coefficients for k = 1, 3 and 4.
func TestApproxKBits(t *testing.T) {
	for _, c := range []approxbp.Coefficients{
		{Name: "relu-deriv", Bits: 1, A: []float64{1}, C: []float64{0}},
		{Name: "k3", Bits: 3, A: []float64{0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.4}, C: []float64{-6, -5, -4, -3, -2, -1, 5.25}},
		{Name: "k4", Bits: 4, A: []float64{0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.3},
			C: []float64{-7, -6.5, -6, -5.5, -5, -4.5, -4, -3.5, -3, -2.5, -2, -1.5, -1, -0.5, 8.75}},
	} {
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		xs := append(gtest.Rand(11, 997, 4), float32(c.C[0]), float32(c.C[len(c.C)-1])+1)
		vs := gtest.Rand(12, len(xs), 1)
		out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := approxbp.Approx(p[0], approxbp.ActGELU, c)
			return engine.Gradient(graph.ReduceAllSum(graph.Mul(y, p[1])), p[0])
		}, gtest.Tensor(xs, len(xs)), gtest.Tensor(vs, len(vs)))
		levels := c.Levels()
		for i, x := range xs {
			want := float64(vs[i]) * levels[code32(c, x)]
			if d := math.Abs(float64(out[0][i]) - want); d > 1e-6 {
				t.Fatalf("%s: x=%g grad %g, want %g", c.Name, x, out[0][i], want)
			}
		}
	}
}

// code32 is the code of x when the breakpoints are compared in float32, as the graph does for float32 inputs.
func code32(c approxbp.Coefficients, x float32) int {
	code := 0
	for _, ci := range c.C {
		if x > float32(ci) {
			code++
		}
	}
	return code
}

// TestApproxWithFittedCoefficients: coefficients from the fitter are data the op takes as they are, for every
// width, and the backward follows their step function.
func TestApproxWithFittedCoefficients(t *testing.T) {
	for bits := 1; bits <= 4; bits++ {
		c, _, err := approxbp.FitSiLU(bits)
		if err != nil {
			t.Fatal(err)
		}
		xs := append(gtest.Rand(uint64(20+bits), 509, 5), float32(c.C[0]), float32(c.C[len(c.C)-1])+0.5)
		vs := gtest.Rand(uint64(30+bits), len(xs), 1)
		out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := approxbp.Approx(p[0], approxbp.ActSiLU, c)
			return append([]*graph.Node{y}, engine.Gradient(graph.ReduceAllSum(graph.Mul(y, p[1])), p[0])...)
		}, gtest.Tensor(xs, len(xs)), gtest.Tensor(vs, len(vs)))
		levels := c.Levels()
		for i, x := range xs {
			if d := math.Abs(float64(out[0][i]) - approxbp.SiLU64(float64(x))); d > 1e-5 {
				t.Fatalf("%s: forward at %g off by %g", c.Name, x, d)
			}
			want := float64(vs[i]) * levels[code32(c, x)]
			if d := math.Abs(float64(out[1][i]) - want); d > 1e-6 {
				t.Fatalf("%s: x=%g grad %g, want %g", c.Name, x, out[1][i], want)
			}
		}
	}
}
