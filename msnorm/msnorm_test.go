package msnorm_test

import (
	"math"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/msnorm"
)

const (
	batch, seq, dim, out = 2, 5, 16, 12
	eps                  = 1e-5
)

// referenceNorm is a textbook norm + affine + linear written with plain GoMLX ops and differentiated by GoMLX's
// own autodiff: the independent reference the custom gradients are checked against.
func referenceNorm(kind string, x, gamma, beta, w, b *graph.Node) *graph.Node {
	var z *graph.Node
	if kind == "ln" {
		mean := graph.ReduceAndKeep(x, graph.ReduceMean, -1)
		c := graph.Sub(x, mean)
		v := graph.ReduceAndKeep(graph.Mul(c, c), graph.ReduceMean, -1)
		z = graph.Div(c, graph.Sqrt(graph.AddScalar(v, eps)))
	} else {
		ms := graph.ReduceAndKeep(graph.Mul(x, x), graph.ReduceMean, -1)
		z = graph.Div(x, graph.Sqrt(graph.AddScalar(ms, eps)))
	}
	scale := gamma
	if kind == "gemma" {
		scale = graph.OnePlus(gamma)
	}
	y := graph.Mul(z, graph.ExpandLeftToRank(scale, 3))
	if beta != nil {
		y = graph.Add(y, graph.ExpandLeftToRank(beta, 3))
	}
	lin := graph.DotGeneral(y, []int{2}, nil, w, []int{1}, nil)
	return graph.Add(lin, graph.ExpandLeftToRank(b, 3))
}

type normCase struct {
	kind    string // "ln", "rms" or "gemma" (RMS with 1 + gamma)
	hasBeta bool
}

// TestMSNormMatchesPlainNorm: MS-LN / MS-RMSNorm followed by the folded linear gives the same output and the same
// gradients (mapped through the folding) as norm + affine + linear differentiated by GoMLX, within 1e-5, and the
// plain LayerNorm/RMSNorm baselines match the reference too.
func TestMSNormMatchesPlainNorm(t *testing.T) {
	for ci, c := range []normCase{{"ln", true}, {"rms", false}, {"gemma", false}} {
		t.Run(c.kind, func(t *testing.T) {
			xs := gtest.Rand(uint64(100+ci), batch*seq*dim, 2)
			for i := range xs { // an offset makes the centring matter
				xs[i] += 0.7
			}
			gamma := gtest.Rand(uint64(200+ci), dim, 0.5)
			for i := range gamma {
				gamma[i] += 1
			}
			beta := gtest.Rand(uint64(300+ci), dim, 0.3)
			if !c.hasBeta {
				beta = nil
			}
			w := gtest.Rand(uint64(400+ci), out*dim, 0.3)
			b := gtest.Rand(uint64(500+ci), out, 0.1)
			r := gtest.Rand(uint64(600+ci), batch*seq*out, 1)
			affine := msnorm.NormAffine{Gamma: gamma, Beta: beta, PlusOne: c.kind == "gemma"}
			folded, err := msnorm.Fold(affine, msnorm.Dense{Out: out, In: dim, W: w, B: b})
			if err != nil {
				t.Fatal(err)
			}
			betaT := gtest.Tensor(make([]float32, dim), dim)
			if beta != nil {
				betaT = gtest.Tensor(beta, dim)
			}
			inputs := []any{gtest.Tensor(xs, batch, seq, dim), gtest.Tensor(gamma, dim), betaT,
				gtest.Tensor(w, out, dim), gtest.Tensor(b, out), gtest.Tensor(r, batch, seq, out),
				gtest.Tensor(folded.W, out, dim), gtest.Tensor(folded.B, out)}
			res := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				x, gm, bt, wt, bs, rt := p[0], p[1], p[2], p[3], p[4], p[5]
				var btOrNil *graph.Node
				if c.hasBeta {
					btOrNil = bt
				}
				loss := func(y *graph.Node) *graph.Node { return graph.ReduceAllSum(graph.Mul(y, rt)) }
				ref := referenceNorm(c.kind, x, gm, btOrNil, wt, bs)
				refGrads := engine.Gradient(loss(ref), x, gm, bt, wt, bs)
				_ = g
				return append([]*graph.Node{ref}, refGrads...)
			}, tensorsOf(inputs)...)
			plain := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				x, gm, bt, wt, bs, rt := p[0], p[1], p[2], p[3], p[4], p[5]
				var y *graph.Node
				switch c.kind {
				case "ln":
					y = msnorm.LayerNorm(x, gm, bt, eps)
				default:
					y = msnorm.RMSNorm(x, gm, eps, c.kind == "gemma")
				}
				y = engine.Linear(y, wt, bs)
				grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(y, rt)), x, gm, bt, wt, bs)
				return append([]*graph.Node{y}, grads...)
			}, tensorsOf(inputs)...)
			ms := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
				x, rt, wf, bf := p[0], p[5], p[6], p[7]
				var z *graph.Node
				if c.kind == "ln" {
					z = msnorm.MSLayerNorm(x, eps)
				} else {
					z = msnorm.MSRMSNorm(x, eps)
				}
				y := engine.Linear(z, wf, bf)
				grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(y, rt)), x, wf, bf)
				return append([]*graph.Node{y}, grads...)
			}, tensorsOf(inputs)...)

			// Map the MS gradients back through the folding: W' = W diag(s), b' = b + W beta, s = gamma (or 1+gamma).
			dWf, dbf := ms[2], ms[3]
			dW := make([]float32, out*dim)
			dGamma := make([]float32, dim)
			dBeta := make([]float32, dim)
			for o := 0; o < out; o++ {
				for i := 0; i < dim; i++ {
					s := float64(gamma[i])
					if c.kind == "gemma" {
						s++
					}
					bi := 0.0
					if beta != nil {
						bi = float64(beta[i])
					}
					dW[o*dim+i] = float32(float64(dWf[o*dim+i])*s + float64(dbf[o])*bi)
					dGamma[i] += float32(float64(dWf[o*dim+i]) * float64(w[o*dim+i]))
					dBeta[i] += float32(float64(dbf[o]) * float64(w[o*dim+i]))
				}
			}
			checks := []struct {
				name      string
				got, want []float32
			}{
				{"ms output", ms[0], res[0]}, {"ms dx", ms[1], res[1]}, {"ms dW (mapped)", dW, res[4]},
				{"ms dgamma (mapped)", dGamma, res[2]}, {"ms db", dbf, res[5]},
				{"plain output", plain[0], res[0]}, {"plain dx", plain[1], res[1]}, {"plain dgamma", plain[2], res[2]},
				{"plain dW", plain[4], res[4]}, {"plain db", plain[5], res[5]},
			}
			if c.hasBeta {
				checks = append(checks, struct {
					name      string
					got, want []float32
				}{"ms dbeta (mapped)", dBeta, res[3]}, struct {
					name      string
					got, want []float32
				}{"plain dbeta", plain[3], res[3]})
			}
			for _, ch := range checks {
				if d := gtest.MaxRelDiff(ch.got, ch.want, 1); d > 1e-5 {
					t.Errorf("%s: max relative diff %g (> 1e-5)", ch.name, d)
				}
			}
		})
	}
}

func tensorsOf(in []any) []*tensors.Tensor {
	out := make([]*tensors.Tensor, len(in))
	for i, v := range in {
		out[i] = v.(*tensors.Tensor)
	}
	return out
}

// TestFoldUnfoldRoundTrip: Unfold(Fold(l)) gives back l, with and without bias, beta and the Gemma form.
func TestFoldUnfoldRoundTrip(t *testing.T) {
	w := gtest.Rand(1, 6*4, 1)
	b := gtest.Rand(2, 6, 1)
	gamma := []float32{0.5, -1.25, 2, 0.75}
	beta := []float32{0.1, 0, -0.3, 0.2}
	for _, tc := range []struct {
		name string
		a    msnorm.NormAffine
		b    []float32
	}{
		{"ln", msnorm.NormAffine{Gamma: gamma, Beta: beta}, b},
		{"ln-no-bias", msnorm.NormAffine{Gamma: gamma, Beta: beta}, nil},
		{"rms", msnorm.NormAffine{Gamma: gamma}, nil},
		{"gemma", msnorm.NormAffine{Gamma: gamma, PlusOne: true}, b},
	} {
		l := msnorm.Dense{Out: 6, In: 4, W: w, B: tc.b}
		f, err := msnorm.Fold(tc.a, l)
		if err != nil {
			t.Fatal(err)
		}
		if (f.B != nil) != (tc.b != nil || tc.a.Beta != nil) {
			t.Errorf("%s: folded bias present=%v", tc.name, f.B != nil)
		}
		u, err := msnorm.Unfold(tc.a, f)
		if err != nil {
			t.Fatal(err)
		}
		if d := gtest.MaxAbsDiff(u.W, w); d > 1e-6 {
			t.Errorf("%s: unfolded W differs by %g", tc.name, d)
		}
		wantB := tc.b
		if wantB == nil && f.B != nil {
			wantB = make([]float32, 6)
		}
		if wantB != nil {
			if d := gtest.MaxAbsDiff(u.B, wantB); d > 1e-6 {
				t.Errorf("%s: unfolded b differs by %g", tc.name, d)
			}
		}
		// The folded layer on z equals the original on the affine output.
		z := []float32{0.3, -1, 2, 0.5}
		for o := 0; o < 6; o++ {
			var y, yf float64
			for i := 0; i < 4; i++ {
				s := float64(gamma[i])
				if tc.a.PlusOne {
					s++
				}
				a := float64(z[i]) * s
				if tc.a.Beta != nil {
					a += float64(tc.a.Beta[i])
				}
				y += float64(w[o*4+i]) * a
				yf += float64(f.W[o*4+i]) * float64(z[i])
			}
			if tc.b != nil {
				y += float64(tc.b[o])
			}
			if f.B != nil {
				yf += float64(f.B[o])
			}
			if math.Abs(y-yf) > 1e-5 {
				t.Errorf("%s: output %d: folded %g, original %g", tc.name, o, yf, y)
			}
		}
	}
}

// TestFoldErrors: shape mismatches and a zero scale are clear errors.
func TestFoldErrors(t *testing.T) {
	l := msnorm.Dense{Out: 2, In: 3, W: make([]float32, 6)}
	if _, err := msnorm.Fold(msnorm.NormAffine{Gamma: []float32{1, 1}}, l); err == nil {
		t.Error("Fold accepted a gamma of the wrong size")
	}
	if _, err := msnorm.Fold(msnorm.NormAffine{Gamma: []float32{1, 1, 1}}, msnorm.Dense{Out: 2, In: 3, W: make([]float32, 5)}); err == nil {
		t.Error("Fold accepted a weight of the wrong size")
	}
	if _, err := msnorm.Unfold(msnorm.NormAffine{Gamma: []float32{1, 0, 1}}, l); err == nil {
		t.Error("Unfold accepted a zero scale")
	}
	if _, err := msnorm.Unfold(msnorm.NormAffine{Gamma: []float32{1, -1, 1}, PlusOne: true}, l); err == nil {
		t.Error("Unfold accepted a zero 1+gamma scale")
	}
}
