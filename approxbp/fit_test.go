package approxbp_test

import (
	"errors"
	"math"
	"math/rand"
	"sort"
	"testing"

	"github.com/memfit/memfit/approxbp"
)

// fitCase is one activation with its integration window and published 2-bit coefficients.
type fitCase struct {
	name      string
	h         func(float64) float64
	lo, hi    float64
	fit       func(int) (approxbp.Coefficients, approxbp.FitResult, error)
	published approxbp.Coefficients
	// optimum is the 2-bit optimum (symmetric: c = (-c0, 0, c0), a = (a0, 1 - 2 a0, a0)), as found by this
	// fitter and, independently, by a Nelder-Mead prototype.
	c0, a0, objective2 float64
}

var fitCases = []fitCase{
	{
		name: "GELU", h: approxbp.GELU64, lo: -approxbp.GELURange, hi: approxbp.GELURange,
		fit: approxbp.FitGELU, published: approxbp.ReGELU2Coefficients,
		c0: 3.1713097425, a0: -0.0495752056, objective2: 0.0095069350475709,
	},
	{
		name: "SiLU", h: approxbp.SiLU64, lo: -approxbp.SiLURange, hi: approxbp.SiLURange,
		fit: approxbp.FitSiLU, published: approxbp.ReSiLU2Coefficients,
		c0: 6.3199334044, a0: -0.0405242941, objective2: 0.0399413164633955,
	},
}

// fitMirror returns (reversed a, -reversed c): for h with h(-x) = h(x) - x (GELU, SiLU) it has the same
// objective as coeffs.
func fitMirror(coeffs approxbp.Coefficients) approxbp.Coefficients {
	m := len(coeffs.C)
	out := coeffs
	out.A, out.C = make([]float64, m), make([]float64, m)
	for i := range coeffs.C {
		out.A[i] = coeffs.A[m-1-i]
		out.C[i] = -coeffs.C[m-1-i]
	}
	return out
}

func fitMaxDiff(x, y []float64) float64 {
	d := 0.0
	for i := range x {
		d = math.Max(d, math.Abs(x[i]-y[i]))
	}
	return d
}

// TestFitTwoBitsVersusPublished fits k = 2 and compares with the published ReGELU2Coefficients/ReSiLU2Coefficients.
//
// The published coefficients come from the paper's simulated annealing and are not the optimum of their
// own objective: the optimum is symmetric and lies ~0.015-0.02 away in c, and the published slopes are not
// even the best slopes for the published breakpoints (FitSlopes moves them by up to 4e-4). So the fitted
// coefficients cannot match the published ones to 1e-3 each (GELU's middle slope differs by 1.19e-3); the
// test bounds the differences by 1.5e-3 (a) and 0.025 (c), and requires the fitted objective to be lower.
func TestFitTwoBitsVersusPublished(t *testing.T) {
	for _, tc := range fitCases {
		t.Run(tc.name, func(t *testing.T) {
			coeffs, res, err := tc.fit(2)
			if err != nil {
				t.Fatal(err)
			}
			if err := coeffs.Validate(); err != nil {
				t.Fatal(err)
			}
			if want := "Re" + tc.name + "2"; coeffs.Name != want || coeffs.Bits != 2 {
				t.Errorf("got name %q bits %d, want %q bits 2", coeffs.Name, coeffs.Bits, want)
			}
			published := approxbp.Objective(tc.h, tc.published, tc.lo, tc.hi)
			t.Logf("fitted %s2: objective %.12g (published %.12g, %.3g lower), iterations %d, local runs %d, |grad| %.2g\n  a = %v\n  c = %v",
				tc.name, res.Objective, published, (published-res.Objective)/published, res.Iterations, res.LocalRuns, res.Gradient, coeffs.A, coeffs.C)
			if got := approxbp.Objective(tc.h, coeffs, tc.lo, tc.hi); got != res.Objective {
				t.Errorf("FitResult.Objective %.17g != Objective() %.17g", res.Objective, got)
			}
			if res.Objective > published+1e-15 {
				t.Errorf("fitted objective %.12g is above the published coefficients' %.12g", res.Objective, published)
			}
			if rel := math.Abs(res.Objective-published) / published; rel > 1e-3 {
				t.Errorf("fitted objective %.12g differs from the published %.12g by %.3g relative (> 1e-3)", res.Objective, published, rel)
			}
			// The optimum is symmetric.
			mirror := fitMirror(coeffs)
			if d := math.Max(fitMaxDiff(mirror.A, coeffs.A), fitMaxDiff(mirror.C, coeffs.C)); d > 1e-6 {
				t.Errorf("fit is not symmetric: max difference to its mirror image %.3g", d)
			}
			if d := fitMaxDiff(coeffs.A, tc.published.A); d > 1.5e-3 {
				t.Errorf("slopes differ from the published ones by %.3g (> 1.5e-3): %v vs %v", d, coeffs.A, tc.published.A)
			}
			if d := fitMaxDiff(coeffs.C, tc.published.C); d > 0.025 {
				t.Errorf("breakpoints differ from the published ones by %.3g (> 0.025): %v vs %v", d, coeffs.C, tc.published.C)
			}
			// The optimum itself (tight: the fit converges to ~1e-9 in c and ~1e-11 in a).
			wantC := []float64{-tc.c0, 0, tc.c0}
			wantA := []float64{tc.a0, 1 - 2*tc.a0, tc.a0}
			if d := fitMaxDiff(coeffs.C, wantC); d > 1e-7 {
				t.Errorf("breakpoints %v, want %v (diff %.3g)", coeffs.C, wantC, d)
			}
			if d := fitMaxDiff(coeffs.A, wantA); d > 1e-8 {
				t.Errorf("slopes %v, want %v (diff %.3g)", coeffs.A, wantA, d)
			}
			if rel := math.Abs(res.Objective-tc.objective2) / tc.objective2; rel > 1e-10 {
				t.Errorf("objective %.15g, want %.15g", res.Objective, tc.objective2)
			}
		})
	}
}

// TestFitSlopesPublishedBreakpoints checks that the best slopes for the published breakpoints are close to the
// published slopes, and that they are indeed better.
func TestFitSlopesPublishedBreakpoints(t *testing.T) {
	for _, tc := range fitCases {
		a, err := approxbp.FitSlopes(tc.h, tc.published.C, tc.lo, tc.hi)
		if err != nil {
			t.Fatal(err)
		}
		if d := fitMaxDiff(a, tc.published.A); d > 1e-3 {
			t.Errorf("%s: FitSlopes(published c) = %v differs from the published a %v by %.3g", tc.name, a, tc.published.A, d)
		}
		refit := tc.published
		refit.A = a
		if err := refit.Validate(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		published := approxbp.Objective(tc.h, tc.published, tc.lo, tc.hi)
		better := approxbp.Objective(tc.h, refit, tc.lo, tc.hi)
		t.Logf("%s: published objective %.12g, with refitted slopes %.12g", tc.name, published, better)
		if !(better < published) {
			t.Errorf("%s: refitted slopes give %.12g, not below the published %.12g", tc.name, better, published)
		}
	}
}

// fitKKTSlopes solves the KKT system of the slope problem directly (dense, with G in closed form and b by
// composite Simpson quadrature), independently of FitSlopes' null-space formulation.
func fitKKTSlopes(h func(float64) float64, c []float64, lo, hi float64) []float64 {
	m := len(c)
	n := m + 2
	K := make([][]float64, n)
	for i := range K {
		K[i] = make([]float64, n+1)
	}
	prim := func(x, ci, cj float64) float64 { return x*x*x/3 - (ci+cj)*x*x/2 + ci*cj*x }
	for i := 0; i < m; i++ {
		for j := 0; j < m; j++ {
			t0 := math.Max(c[i], c[j])
			K[i][j] = prim(hi, c[i], c[j]) - prim(t0, c[i], c[j])
		}
		K[i][m], K[i][m+1] = 1, c[i]
		K[m][i], K[m+1][i] = 1, c[i]
		// b_i = int_{c_i}^{hi} h(x) (x - c_i) dx by Simpson's rule.
		const steps = 200000
		dx := (hi - c[i]) / steps
		s := 0.0
		for k := 0; k <= steps; k++ {
			x := c[i] + float64(k)*dx
			w := 2.0
			if k == 0 || k == steps {
				w = 1
			} else if k%2 == 1 {
				w = 4
			}
			s += w * h(x) * (x - c[i])
		}
		K[i][n] = s * dx / 3
	}
	K[m][n], K[m+1][n] = 1, 0
	// Gaussian elimination with partial pivoting.
	for col := 0; col < n; col++ {
		p := col
		for r := col + 1; r < n; r++ {
			if math.Abs(K[r][col]) > math.Abs(K[p][col]) {
				p = r
			}
		}
		K[col], K[p] = K[p], K[col]
		for r := col + 1; r < n; r++ {
			f := K[r][col] / K[col][col]
			for k := col; k <= n; k++ {
				K[r][k] -= f * K[col][k]
			}
		}
	}
	x := make([]float64, n)
	for r := n - 1; r >= 0; r-- {
		s := K[r][n]
		for k := r + 1; k < n; k++ {
			s -= K[r][k] * x[k]
		}
		x[r] = s / K[r][r]
	}
	return x[:m]
}

// TestFitSlopesMatchesKKT compares FitSlopes with a direct dense solve of the KKT system, on the published
// breakpoints and on arbitrary asymmetric ones, and checks that no feasible perturbation of the slopes helps.
func TestFitSlopesMatchesKKT(t *testing.T) {
	for _, tc := range fitCases {
		for _, c := range [][]float64{
			tc.published.C,
			{-2.9, -1.7, -0.4, 0.3, 1.1, 2.0, 3.6},
			{-1.5, 0.5},
		} {
			a, err := approxbp.FitSlopes(tc.h, c, tc.lo, tc.hi)
			if err != nil {
				t.Fatal(err)
			}
			want := fitKKTSlopes(tc.h, c, tc.lo, tc.hi)
			if d := fitMaxDiff(a, want); d > 1e-7 {
				t.Errorf("%s c=%v: FitSlopes %v, KKT solve %v (diff %.3g)", tc.name, c, a, want, d)
			}
			coeffs := approxbp.Coefficients{Name: "x", A: a, C: c}
			base := approxbp.Objective(tc.h, coeffs, tc.lo, tc.hi)
			// Perturb along feasible directions (keeping sum a and sum a*c): second differences of three
			// consecutive slopes, v = (c3 - c2, c1 - c3, c2 - c1) on slopes i, i+1, i+2.
			for i := 0; i+2 < len(c); i++ {
				v := []float64{c[i+2] - c[i+1], c[i] - c[i+2], c[i+1] - c[i]}
				for _, eps := range []float64{-1e-3, 1e-3} {
					p := approxbp.Coefficients{A: append([]float64(nil), a...), C: c}
					for k := range v {
						p.A[i+k] += eps * v[k]
					}
					if got := approxbp.Objective(tc.h, p, tc.lo, tc.hi); !(got > base) {
						t.Errorf("%s c=%v: feasible perturbation %d (%g) lowers the objective %.15g -> %.15g", tc.name, c, i, eps, base, got)
					}
				}
			}
		}
	}
}

// TestFitAllBits fits k = 1..4: constraints, k = 1 degenerate case, objective decreasing in k, reference
// values, convergence.
func TestFitAllBits(t *testing.T) {
	// Reference objectives (k = 1..4), from this fitter; k = 1 has the closed forms of TestObjectiveClosedForms.
	want := map[string][]float64{
		"GELU": {0.061765054245446684, 0.0095069350475709, 0.00017889895212993, 9.0337178491234e-06},
		"SiLU": {0.31630257578233006, 0.0399413164633955, 0.0011969394647617, 6.6564136836942e-05},
	}
	for _, tc := range fitCases {
		prev := math.Inf(1)
		for k := 1; k <= 4; k++ {
			coeffs, res, err := tc.fit(k)
			if err != nil {
				t.Fatalf("%s k=%d: %v", tc.name, k, err)
			}
			t.Logf("%s k=%d: objective %.15g, iterations %d, local runs %d, |grad| %.2g\n  a = %v\n  c = %v",
				tc.name, k, res.Objective, res.Iterations, res.LocalRuns, res.Gradient, coeffs.A, coeffs.C)
			if err := coeffs.Validate(); err != nil {
				t.Errorf("%s k=%d: %v", tc.name, k, err)
			}
			var sumA, sumAC float64
			for i := range coeffs.A {
				sumA += coeffs.A[i]
				sumAC += coeffs.A[i] * coeffs.C[i]
			}
			if math.Abs(sumA-1) > 1e-12 || math.Abs(sumAC) > 1e-12 {
				t.Errorf("%s k=%d: constraints: sum a - 1 = %.3g, sum a*c = %.3g", tc.name, k, sumA-1, sumAC)
			}
			if k == 1 && (len(coeffs.A) != 1 || coeffs.A[0] != 1 || coeffs.C[0] != 0) {
				t.Errorf("%s k=1: got a=%v c=%v, want a=[1] c=[0]", tc.name, coeffs.A, coeffs.C)
			}
			if k > 1 && res.Gradient > approxbp.FitGradientTol {
				t.Errorf("%s k=%d: gradient %.3g above tolerance", tc.name, k, res.Gradient)
			}
			if !(res.Objective < prev) {
				t.Errorf("%s k=%d: objective %.12g does not decrease (k-1: %.12g)", tc.name, k, res.Objective, prev)
			}
			prev = res.Objective
			if w := want[tc.name][k-1]; math.Abs(res.Objective-w) > 1e-10*w {
				t.Errorf("%s k=%d: objective %.15g, want %.15g", tc.name, k, res.Objective, w)
			}
			// Mirror symmetry of the problem: the mirror image is as good.
			if k > 1 {
				m := approxbp.Objective(tc.h, fitMirror(coeffs), tc.lo, tc.hi)
				if math.Abs(m-res.Objective) > 1e-12*res.Objective {
					t.Errorf("%s k=%d: mirror image objective %.15g != %.15g", tc.name, k, m, res.Objective)
				}
			}
		}
	}
}

// TestFitLocalMinima: the objective has local minima in the breakpoints, which is why Fit searches from
// several starts. From a symmetric start, GELU k = 3 lands on a symmetric local optimum that is worse than the
// (asymmetric) optimum Fit finds; Fit returns the mirror twin with the larger sum of breakpoints.
func TestFitLocalMinima(t *testing.T) {
	best, res, err := approxbp.FitGELU(3)
	if err != nil {
		t.Fatal(err)
	}
	if d := fitMaxDiff(fitMirror(best).C, best.C); d < 0.1 {
		t.Errorf("expected the GELU k=3 optimum to be asymmetric, got c = %v", best.C)
	}
	var s float64
	for _, c := range best.C {
		s += c
	}
	if !(s > 0) {
		t.Errorf("tie-break: expected a positive sum of breakpoints, got %v", best.C)
	}
	start := []float64{-3, -2, -0.6, 0, 0.6, 2, 3}
	local, lres, err := approxbp.Fit("local", approxbp.GELU64, 3, approxbp.FitOptions{Lower: -12, Upper: 12, Start: start})
	if err != nil {
		t.Fatal(err)
	}
	if lres.LocalRuns != 1 {
		t.Errorf("with a start, expected 1 local run, got %d", lres.LocalRuns)
	}
	if d := fitMaxDiff(fitMirror(local).C, local.C); d > 1e-6 {
		t.Errorf("symmetric start should stay symmetric, got c = %v", local.C)
	}
	t.Logf("GELU k=3: multi-start %.12g, symmetric local optimum %.12g", res.Objective, lres.Objective)
	if !(lres.Objective > 1.1*res.Objective) {
		t.Errorf("symmetric local optimum %.12g is not clearly worse than the fitted %.12g", lres.Objective, res.Objective)
	}
}

// TestFitRandomStartsDoNotBeatFit refines random starts and checks none beats the multi-start result.
func TestFitRandomStartsDoNotBeatFit(t *testing.T) {
	if testing.Short() {
		t.Skip("random-start scan in -short mode")
	}
	rng := rand.New(rand.NewSource(1))
	for _, tc := range fitCases {
		for k := 3; k <= 4; k++ {
			_, res, err := tc.fit(k)
			if err != nil {
				t.Fatal(err)
			}
			m := 1<<k - 1
			scale := tc.published.C[2] // ~3 for GELU, ~6 for SiLU
			tried := 0
			for tried < 25 {
				st := make([]float64, m)
				for i := range st {
					st[i] = rng.NormFloat64() * scale
				}
				sort.Float64s(st)
				ok := true
				for i := 1; i < m; i++ {
					ok = ok && st[i]-st[i-1] > 1e-3
				}
				if !ok || st[0] <= tc.lo || st[m-1] >= tc.hi {
					continue
				}
				tried++
				_, r, err := approxbp.Fit("scan", tc.h, k, approxbp.FitOptions{Lower: tc.lo, Upper: tc.hi, Start: st})
				if err != nil {
					continue
				}
				if r.Objective < res.Objective*(1-1e-9) {
					t.Errorf("%s k=%d: random start %v reaches %.15g < fitted %.15g", tc.name, k, st, r.Objective, res.Objective)
				}
			}
		}
	}
}

// TestObjectiveClosedForms checks the quadrature against closed forms.
func TestObjectiveClosedForms(t *testing.T) {
	relu := approxbp.Coefficients{Name: "ReLU", Bits: 1, A: []float64{1}, C: []float64{0}}
	// int_R (GELU - relu)^2 = 2 int_0^inf x^2 Phi(-x)^2 dx = (4/3) (1/sqrt(2 pi) - 5/(8 sqrt(pi)))
	// (integrate by parts twice, using d/dx[(x^2 + 2) phi] = -x^3 phi).
	gelu := 4.0 / 3 * (1/math.Sqrt(2*math.Pi) - 5/(8*math.Sqrt(math.Pi)))
	// int_R (SiLU - relu)^2 = 2 int_0^inf x^2 / (1 + e^x)^2 dx = 3 zeta(3) - pi^2/3
	// (1/(1+e^x)^2 = 1/(1+e^x) - e^x/(1+e^x)^2, int x^2/(1+e^x) = (3/2) zeta(3), int x^2 e^x/(1+e^x)^2 = zeta(2)).
	const zeta3 = 1.2020569031595942854
	silu := 3*zeta3 - math.Pi*math.Pi/3
	for _, c := range []struct {
		name   string
		h      func(float64) float64
		lo, hi float64
		want   float64
	}{
		{"GELU", approxbp.GELU64, -approxbp.GELURange, approxbp.GELURange, gelu},
		{"SiLU", approxbp.SiLU64, -approxbp.SiLURange, approxbp.SiLURange, silu},
	} {
		got := approxbp.Objective(c.h, relu, c.lo, c.hi)
		if rel := math.Abs(got-c.want) / c.want; rel > 1e-13 {
			t.Errorf("%s: int (h - relu)^2 = %.17g, closed form %.17g (rel %.3g)", c.name, got, c.want, rel)
		}
	}

	// A polynomial case, exact by Boole's rule on each linear piece: h(x) = x^2 - x/2 on [-1, 2] against an
	// unconstrained two-breakpoint approximation (the residual is a quadratic, its square a quartic).
	h := func(x float64) float64 { return x*x - x/2 }
	coeffs := approxbp.Coefficients{A: []float64{0.7, 1.9}, C: []float64{-0.25, 1.1}}
	cuts := []float64{-1, -0.25, 1.1, 2}
	want := 0.0
	for i := 0; i+1 < len(cuts); i++ {
		a, b := cuts[i], cuts[i+1]
		f := func(j int) float64 {
			x := a + float64(j)*(b-a)/4
			r := h(x) - coeffs.Eval(x)
			return r * r
		}
		want += (b - a) / 90 * (7*f(0) + 32*f(1) + 12*f(2) + 32*f(3) + 7*f(4))
	}
	if got := approxbp.Objective(h, coeffs, -1, 2); math.Abs(got-want) > 1e-13*want {
		t.Errorf("polynomial case: Objective %.17g, Boole %.17g", got, want)
	}
	// Breakpoints outside the window and an empty A/C are fine; malformed input gives NaN.
	if got := approxbp.Objective(h, approxbp.Coefficients{}, 0, 3); math.Abs(got-(243.0/5-81.0/4+27.0/12)) > 1e-12 {
		// int_0^3 (x^2 - x/2)^2 = 3^5/5 - 3^4/4 + 3^3/12
		t.Errorf("no breakpoints: got %.17g", got)
	}
	if got := approxbp.Objective(h, approxbp.Coefficients{A: []float64{1}, C: []float64{0, 1}}, -1, 1); !math.IsNaN(got) {
		t.Errorf("mismatched A and C: got %g, want NaN", got)
	}
	if got := approxbp.Objective(h, relu, 1, 1); !math.IsNaN(got) {
		t.Errorf("empty window: got %g, want NaN", got)
	}
	if got := approxbp.Objective(nil, relu, -1, 1); !math.IsNaN(got) {
		t.Errorf("nil h: got %g, want NaN", got)
	}
}

// TestFitDeterministic: two fits give bit-identical coefficients.
func TestFitDeterministic(t *testing.T) {
	a, ra, err := approxbp.FitSiLU(3)
	if err != nil {
		t.Fatal(err)
	}
	b, rb, err := approxbp.FitSiLU(3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.A {
		if a.A[i] != b.A[i] || a.C[i] != b.C[i] {
			t.Fatalf("fits differ: %v %v vs %v %v", a.A, a.C, b.A, b.C)
		}
	}
	if ra != rb {
		t.Errorf("results differ: %+v vs %+v", ra, rb)
	}
}

// TestFitBadInput checks that bad input returns errors (and never panics).
func TestFitBadInput(t *testing.T) {
	g := approxbp.GELU64
	for _, c := range []struct {
		name string
		bits int
		h    func(float64) float64
		opts approxbp.FitOptions
	}{
		{"bits 0", 0, g, approxbp.FitOptions{}},
		{"bits 5", 5, g, approxbp.FitOptions{}},
		{"bits -1", -1, g, approxbp.FitOptions{}},
		{"lower > upper", 2, g, approxbp.FitOptions{Lower: 1, Upper: -1}},
		{"lower == upper", 2, g, approxbp.FitOptions{Lower: 3, Upper: 3}},
		{"NaN window", 2, g, approxbp.FitOptions{Lower: math.NaN(), Upper: 1}},
		{"infinite window", 2, g, approxbp.FitOptions{Lower: math.Inf(-1), Upper: 12}},
		{"unsorted start", 2, g, approxbp.FitOptions{Lower: -12, Upper: 12, Start: []float64{1, 0, -1}}},
		{"repeated start", 2, g, approxbp.FitOptions{Lower: -12, Upper: 12, Start: []float64{-1, 0, 0}}},
		{"short start", 2, g, approxbp.FitOptions{Lower: -12, Upper: 12, Start: []float64{-1, 1}}},
		{"start outside window", 2, g, approxbp.FitOptions{Lower: -12, Upper: 12, Start: []float64{-13, 0, 1}}},
		{"NaN start", 2, g, approxbp.FitOptions{Lower: -12, Upper: 12, Start: []float64{-1, math.NaN(), 1}}},
		{"negative MaxIter", 2, g, approxbp.FitOptions{MaxIter: -1}},
		{"negative Candidates", 2, g, approxbp.FitOptions{Candidates: -1}},
		{"nil h", 2, nil, approxbp.FitOptions{}},
		{"NaN h", 2, func(x float64) float64 { return math.NaN() }, approxbp.FitOptions{Lower: -5, Upper: 5}},
		{"NaN h k=1", 1, func(x float64) float64 { return math.NaN() }, approxbp.FitOptions{Lower: -5, Upper: 5}},
	} {
		if _, _, err := approxbp.Fit("bad", c.h, c.bits, c.opts); err == nil {
			t.Errorf("%s: Fit returned no error", c.name)
		}
	}
	for _, bits := range []int{0, 5} {
		if _, _, err := approxbp.FitGELU(bits); err == nil {
			t.Errorf("FitGELU(%d): no error", bits)
		}
		if _, _, err := approxbp.FitSiLU(bits); err == nil {
			t.Errorf("FitSiLU(%d): no error", bits)
		}
	}
	for _, c := range []struct {
		name   string
		c      []float64
		lo, hi float64
	}{
		{"unsorted", []float64{1, 0, -1}, -12, 12},
		{"repeated", []float64{-1, -1, 2}, -12, 12},
		{"empty", nil, -12, 12},
		{"single nonzero", []float64{0.5}, -12, 12},
		{"outside window", []float64{-1, 0, 20}, -12, 12},
		{"empty window", []float64{-1, 0, 1}, 12, -12},
	} {
		if _, err := approxbp.FitSlopes(g, c.c, c.lo, c.hi); err == nil {
			t.Errorf("FitSlopes %s: no error", c.name)
		}
	}
	if _, err := approxbp.FitSlopes(nil, []float64{-1, 0, 1}, -12, 12); err == nil {
		t.Errorf("FitSlopes nil h: no error")
	}
	if a, err := approxbp.FitSlopes(g, []float64{0}, -12, 12); err != nil || len(a) != 1 || a[0] != 1 {
		t.Errorf("FitSlopes single 0: got %v, %v; want [1]", a, err)
	}
	// An iteration limit reached before convergence is reported, with usable coefficients.
	coeffs, _, err := approxbp.Fit("short", g, 3, approxbp.FitOptions{Lower: -12, Upper: 12, MaxIter: 1, Start: []float64{-6, -5, -4, 0, 4, 5, 6}})
	if !errors.Is(err, approxbp.ErrNotConverged) {
		t.Errorf("MaxIter 1: got error %v, want ErrNotConverged", err)
	} else if verr := coeffs.Validate(); verr != nil {
		t.Errorf("MaxIter 1: coefficients returned with ErrNotConverged are invalid: %v", verr)
	}
}

// TestReGELU2TanhIsFitted: ReGELU2TanhCoefficients are what Fit finds for the tanh GELU (gelu_pytorch_tanh) on
// [-12, 12], and they beat the published ReGELU2 coefficients on that function.
func TestReGELU2TanhIsFitted(t *testing.T) {
	got, res, err := approxbp.FitGELUTanh(2)
	if err != nil {
		t.Fatal(err)
	}
	want := approxbp.ReGELU2TanhCoefficients
	if got.Name != want.Name || fitMaxDiff(got.A, want.A) > 1e-12 || fitMaxDiff(got.C, want.C) > 1e-12 {
		t.Errorf("fitted %+v, recorded %+v", got, want)
	}
	if pub := approxbp.Objective(approxbp.GELUTanh64, approxbp.ReGELU2Coefficients, -approxbp.GELURange, approxbp.GELURange); res.Objective >= pub {
		t.Errorf("objective %.6g, published ReGELU2's on the tanh GELU %.6g", res.Objective, pub)
	}
}
