package approxbp

// Deterministic coefficient fitter for the ReLU-formed approximations (Approx-BP, ReGELU2/ReSiLU2 and
// their k-bit generalisations).
//
// # What is minimised
//
// For an activation h and k bits there are m = 2^k - 1 breakpoints c (ascending) and slopes a, and
//
//	g(x) = sum_i a_i relu(x - c_i),
//	J(a, c) = integral over R of (h(x) - g(x))^2 dx,   subject to  sum_i a_i = 1,  sum_i a_i c_i = 0.
//
// Why the tails are exact: for x < c_0 every relu term is zero, so the residual is h(x), which decays for
// GELU and SiLU. For x > c_{m-1} every term is active, so g(x) = (sum a_i) x - sum a_i c_i = x by the two
// constraints, and the residual is h(x) - x, which also decays. So J is finite, and integrating over a
// finite window [lo, hi] (GELU: +-12, SiLU: +-50) changes it by far less than a rounding error.
//
// # The slopes for fixed breakpoints (the KKT system, and how it is actually solved)
//
// J is quadratic in a: J = const - 2 b.a + a.G a with G_ij = int relu(x-c_i) relu(x-c_j) dx and
// b_i = int h(x) relu(x-c_i) dx over [lo, hi]. With multipliers l1, l2 for the two linear constraints the
// minimiser solves the KKT system
//
//	[ G    1  c ] [ a  ]   [ b ]
//	[ 1^T  0  0 ] [ l1 ] = [ 1 ]
//	[ c^T  0  0 ] [ l2 ]   [ 0 ].
//
// Solved as written, G and b have entries of order (hi - c)^3 (hundreds to tens of thousands) whose
// differences carry the answer, so the code solves the same problem in the null space of the constraints
// instead. The constraint set is exactly the set of continuous piecewise-linear functions with knots c that
// are 0 left of c_0 and x right of c_{m-1}; such a g is determined by its nodal values y_j = g(c_j), where
// y_0 = 0 and y_{m-1} = c_{m-1} are fixed by the constraints and y_1 .. y_{m-2} are free (m - 2 = number of
// unknowns minus number of constraints). With hat functions phi_j on the knots, g = sum_j y_j phi_j on
// [c_0, c_{m-1}], and minimising J over y is the L2 projection of h onto the hats:
//
//	sum_k M_jk y_k = f_j  (j = 1 .. m-2),   M = tridiagonal mass matrix (M_jj = (D_{j-1} + D_j)/3,
//	M_j,j+1 = D_j/6, D_j = c_{j+1} - c_j),   f_j = int h phi_j dx,
//
// with the known y_0, y_{m-1} moved to the right-hand side. M is symmetric positive definite and all its
// entries are O(1), so the solve is accurate to rounding. The slopes follow as the jumps of g':
// a_0 = s_0, a_i = s_i - s_{i-1}, a_{m-1} = 1 - s_{m-2} with s_j = (y_{j+1} - y_j)/D_j; they satisfy the
// constraints by construction and are the solution of the KKT system above (the tests check this against a
// dense KKT solve).
//
// # The breakpoints
//
// F(c) = min_a J(a, c) is minimised over c by a damped Newton (Levenberg-Marquardt) iteration. The gradient
// is analytic by the envelope theorem (the optimal y makes dJ/dy = 0, and the integration limits at the
// knots cancel because the integrand is continuous there): moving knot c_j with the nodal values fixed
// changes g by -g'(x) phi_j(x) (plus phi_j(x) for the last knot, whose value y_{m-1} = c_{m-1} moves too), so
//
//	dF/dc_j = 2 int (h - g) g' phi_j dx  -  [j = m-1] 2 int (h - g) phi_j dx.
//
// The Hessian is a central difference of this gradient. Steps are accepted only when they decrease F (or,
// once F is flat to rounding, when they decrease the gradient), keep the knots ascending and inside the
// window, and the iteration stops when max |dF/dc_j| is below FitGradientTol.
//
// F has many local minima: they differ in how many knots sit between the inflection points of h
// (|x| < sqrt 2 for GELU, |x| < 2.40 for SiLU) and how many outside, where h'' changes sign and the
// knots cluster apart. So unless FitOptions.Start is given, Fit runs a deterministic multi-start: it
// tabulates the asymptotically optimal knot density |h''|^(2/5) (a second difference on a grid), splits
// the window at its sign changes, builds one start per way of distributing the m knots over these regions
// (equidistributing the density inside each region, 136 starts for k = 4), screens them by their objective,
// and refines the best DefaultFitCandidates of them plus the globally equidistributed start with Newton,
// keeping the best local optimum. On GELU and SiLU, k = 2..4, this matches the best of ~3,000 random
// starts per case. The problem is mirror-symmetric for GELU and SiLU (h(-x) = h(x) - x, so (a, c) and
// (reversed a, -reversed c) have the same objective). For k = 2, for k = 4 and for SiLU with k = 3 the
// optimum is itself symmetric, but for GELU with k = 3 it is not (the knots split 1 / 4 / 2 over the
// regions; the best symmetric point is 22% worse) and the optima form a mirror pair: Fit breaks such ties
// by returning the point with the larger sum of breakpoints. Everything is deterministic.
//
// # Quadrature
//
// Between consecutive knots (and in the tails) the integrands are smooth, so every integral uses 20-point
// Gauss-Legendre on pieces of length at most 1 between the knots; products of hats are integrated exactly.
// For k = 1 the constraints force a = [1], c = [0] and there is nothing to optimise.

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// GELURange is the default half-width of the integration window used by FitGELU: [-12, 12]. Outside it the
// GELU residuals (h(x) for x < 0, h(x) - x for x > 0) are below 1e-30.
const GELURange = 12.0

// SiLURange is the default half-width of the integration window used by FitSiLU: [-50, 50]. Outside it the
// SiLU residuals are below 1e-20.
const SiLURange = 50.0

// DefaultRange is the half-width of the window Fit uses when FitOptions leaves both Lower and Upper at zero.
const DefaultRange = 50.0

// FitGradientTol is the convergence threshold of Fit on the largest absolute partial derivative of the
// objective with respect to the breakpoints.
const FitGradientTol = 1e-12

// DefaultFitCandidates is the number of screened multi-start points Fit refines when
// FitOptions.Candidates is zero.
const DefaultFitCandidates = 6

// DefaultFitMaxIter is the Newton iteration limit Fit uses when FitOptions.MaxIter is zero.
const DefaultFitMaxIter = 200

// ErrNotConverged is returned (wrapped) by Fit when the iteration limit is reached before the gradient
// tolerance; the coefficients returned with it are the best found so far.
var ErrNotConverged = errors.New("approxbp: coefficient fit did not converge")

// FitOptions configure Fit. The zero value selects the defaults.
type FitOptions struct {
	// Lower and Upper bound the integration window. Both zero selects [-DefaultRange, DefaultRange].
	Lower, Upper float64
	// Start are initial breakpoints (2^bits - 1 of them, strictly ascending, inside the window). When set,
	// Fit runs a single local Newton iteration from them (and may return a local minimum). Nil selects the
	// deterministic multi-start search described at the top of fit.go.
	Start []float64
	// MaxIter limits the Newton iterations of each local run; zero selects DefaultFitMaxIter.
	MaxIter int
	// Candidates is how many of the screened multi-start points are refined by Newton (the equidistributed
	// start is always refined as well); zero selects DefaultFitCandidates. Ignored when Start is set.
	Candidates int
}

// FitResult reports how a fit went.
type FitResult struct {
	// Objective is the integral of (h - h~)^2 over the window for the returned coefficients (see Objective).
	Objective float64
	// Iterations is the number of accepted Newton steps of the local run that produced the result.
	Iterations int
	// LocalRuns is the number of local Newton runs (starting points refined); 0 for bits = 1.
	LocalRuns int
	// Gradient is the largest absolute partial derivative of the objective with respect to the breakpoints
	// at the returned coefficients (0 for bits = 1, where there is nothing to optimise).
	Gradient float64
}

// FitGELU fits k-bit coefficients ("ReGELU<k>") for the exact GELU on [-GELURange, GELURange].
func FitGELU(bits int) (Coefficients, FitResult, error) {
	return Fit(fmt.Sprintf("ReGELU%d", bits), GELU64, bits, FitOptions{Lower: -GELURange, Upper: GELURange})
}

// FitGELUTanh fits k-bit coefficients ("ReGELU<k>-tanh") for GELU's tanh form on [-GELURange, GELURange].
func FitGELUTanh(bits int) (Coefficients, FitResult, error) {
	return Fit(fmt.Sprintf("ReGELU%d-tanh", bits), GELUTanh64, bits, FitOptions{Lower: -GELURange, Upper: GELURange})
}

// FitSiLU fits k-bit coefficients ("ReSiLU<k>") for SiLU on [-SiLURange, SiLURange].
func FitSiLU(bits int) (Coefficients, FitResult, error) {
	return Fit(fmt.Sprintf("ReSiLU%d", bits), SiLU64, bits, FitOptions{Lower: -SiLURange, Upper: SiLURange})
}

// Fit returns the k-bit coefficients (bits in 1..4) that minimise the integral over the window of
// (h(x) - sum_i a_i relu(x - c_i))^2 subject to sum a = 1 and sum a*c = 0 (see the comment at the top of
// fit.go for the method). h must make the integrand small at both ends of the window, i.e. h(x) -> 0 for
// x -> -inf and h(x) - x -> 0 for x -> +inf, as GELU and SiLU do. The result is named name and passes
// Validate. Bad input returns an error; so does an iteration limit reached before convergence (wrapping
// ErrNotConverged, with the best coefficients found returned alongside).
func Fit(name string, h func(float64) float64, bits int, opts FitOptions) (Coefficients, FitResult, error) {
	if h == nil {
		return Coefficients{}, FitResult{}, errors.New("approxbp: Fit: nil activation")
	}
	if bits < 1 || bits > 4 {
		return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: bits must be 1..4, got %d", bits)
	}
	lo, hi := opts.Lower, opts.Upper
	if lo == 0 && hi == 0 {
		lo, hi = -DefaultRange, DefaultRange
	}
	if err := checkWindow(lo, hi); err != nil {
		return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: %w", err)
	}
	maxIter := opts.MaxIter
	if maxIter < 0 {
		return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: MaxIter must be >= 0, got %d", maxIter)
	}
	if maxIter == 0 {
		maxIter = DefaultFitMaxIter
	}
	m := 1<<bits - 1
	if opts.Start != nil {
		if len(opts.Start) != m {
			return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: %d bits need %d start breakpoints, got %d", bits, m, len(opts.Start))
		}
		if err := checkBreakpoints(opts.Start, lo, hi); err != nil {
			return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: start: %w", err)
		}
	}
	candidates := opts.Candidates
	if candidates < 0 {
		return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: Candidates must be >= 0, got %d", candidates)
	}
	if candidates == 0 {
		candidates = DefaultFitCandidates
	}

	if m == 1 {
		// sum a = 1 and a*c = 0 force a = [1], c = [0].
		coeffs := Coefficients{Name: name, Bits: bits, A: []float64{1}, C: []float64{0}}
		obj := Objective(h, coeffs, lo, hi)
		if !isFinite(obj) {
			return Coefficients{}, FitResult{}, errors.New("approxbp: Fit: objective is not finite (does h return NaN or Inf?)")
		}
		return coeffs, FitResult{Objective: obj}, nil
	}

	f := &fitter{h: h, lo: lo, hi: hi}
	var starts [][]float64
	if opts.Start != nil {
		starts = [][]float64{append([]float64(nil), opts.Start...)}
	} else {
		var err error
		if starts, err = f.multiStarts(m, candidates); err != nil {
			return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: %w", err)
		}
	}

	type local struct {
		c         []float64
		F, gnorm  float64
		iters     int
		converged bool
	}
	var best *local
	for _, start := range starts {
		c, gnorm, iters, converged, err := f.minimize(start, maxIter)
		if err != nil {
			return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: %w", err)
		}
		F, _, _, err := f.eval(c, true, false)
		if err != nil {
			return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: %w", err)
		}
		r := &local{c, F, gnorm, iters, converged}
		switch {
		case best == nil, r.converged && !best.converged:
			best = r
		case r.converged != best.converged:
		case math.Abs(r.F-best.F) <= fitTieTol*best.F:
			// A tie, typically the mirror image of the best point: prefer the larger sum of breakpoints.
			if sum(r.c) > sum(best.c)+fitTieTol {
				best = r
			}
		case r.F < best.F:
			best = r
		}
	}

	_, _, y, err := f.eval(best.c, false, false)
	if err != nil {
		return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: %w", err)
	}
	coeffs := Coefficients{Name: name, Bits: bits, A: slopesFromNodal(best.c, y), C: best.c}
	res := FitResult{Objective: Objective(h, coeffs, lo, hi), Iterations: best.iters, LocalRuns: len(starts), Gradient: best.gnorm}
	if err := coeffs.Validate(); err != nil {
		return Coefficients{}, FitResult{}, fmt.Errorf("approxbp: Fit: internal error: %w", err)
	}
	if !best.converged {
		return coeffs, res, fmt.Errorf("%w: %s: gradient %.3g > %g after at most %d iterations per start", ErrNotConverged, name, best.gnorm, FitGradientTol, maxIter)
	}
	return coeffs, res, nil
}

// FitSlopes returns the slopes a that minimise the integral over [lower, upper] of
// (h(x) - sum_i a_i relu(x - c_i))^2 subject to sum a = 1 and sum a*c = 0, for fixed breakpoints c
// (strictly ascending, inside the window; any count >= 1, a single breakpoint must be 0 since the
// constraints force it). It is the solution of the KKT system described at the top of fit.go.
func FitSlopes(h func(float64) float64, c []float64, lower, upper float64) ([]float64, error) {
	if h == nil {
		return nil, errors.New("approxbp: FitSlopes: nil activation")
	}
	if err := checkWindow(lower, upper); err != nil {
		return nil, fmt.Errorf("approxbp: FitSlopes: %w", err)
	}
	if len(c) == 0 {
		return nil, errors.New("approxbp: FitSlopes: no breakpoints")
	}
	if err := checkBreakpoints(c, lower, upper); err != nil {
		return nil, fmt.Errorf("approxbp: FitSlopes: %w", err)
	}
	if len(c) == 1 {
		if c[0] != 0 {
			return nil, fmt.Errorf("approxbp: FitSlopes: a single breakpoint must be 0 (sum a = 1 and a*c = 0), got %g", c[0])
		}
		return []float64{1}, nil
	}
	f := &fitter{h: h, lo: lower, hi: upper}
	_, _, y, err := f.eval(c, false, false)
	if err != nil {
		return nil, fmt.Errorf("approxbp: FitSlopes: %w", err)
	}
	return slopesFromNodal(c, y), nil
}

// Objective returns the integral over [lower, upper] of (h(x) - coeffs.Eval(x))^2, the quantity Fit
// minimises, for any coefficients (the constraints are not required). The integrand is split at the
// breakpoints and integrated with composite Gauss-Legendre quadrature. It returns NaN for a nil h,
// mismatched A and C, non-finite coefficients or an empty or non-finite window.
func Objective(h func(float64) float64, coeffs Coefficients, lower, upper float64) float64 {
	if h == nil || len(coeffs.A) != len(coeffs.C) || checkWindow(lower, upper) != nil {
		return math.NaN()
	}
	for i := range coeffs.A {
		if !isFinite(coeffs.A[i]) || !isFinite(coeffs.C[i]) {
			return math.NaN()
		}
	}
	// The approximation is linear between consecutive breakpoints: integrate each piece separately.
	cuts := []float64{lower}
	sorted := append([]float64(nil), coeffs.C...)
	sort.Float64s(sorted)
	for _, ci := range sorted {
		if ci > cuts[len(cuts)-1] && ci < upper {
			cuts = append(cuts, ci)
		}
	}
	cuts = append(cuts, upper)
	sum := 0.0
	for i := 0; i+1 < len(cuts); i++ {
		sum += integrate(func(x float64) float64 {
			r := h(x) - coeffs.Eval(x)
			return r * r
		}, cuts[i], cuts[i+1])
	}
	return sum
}

// ----------------------------------------------------------------------------------------------------
// Internals.

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func checkWindow(lo, hi float64) error {
	if !isFinite(lo) || !isFinite(hi) {
		return fmt.Errorf("integration window must be finite, got [%g, %g]", lo, hi)
	}
	if lo >= hi {
		return fmt.Errorf("integration window needs lower < upper, got [%g, %g]", lo, hi)
	}
	return nil
}

func checkBreakpoints(c []float64, lo, hi float64) error {
	for i, ci := range c {
		if !isFinite(ci) {
			return fmt.Errorf("breakpoints must be finite, got %v", c)
		}
		if i > 0 && !(ci > c[i-1]) {
			return fmt.Errorf("breakpoints must be strictly ascending, got %v", c)
		}
	}
	if c[0] < lo || c[len(c)-1] > hi {
		return fmt.Errorf("breakpoints %v must lie inside the window [%g, %g]", c, lo, hi)
	}
	return nil
}

// slopesFromNodal converts the nodal values y (y_0 = 0, y_{m-1} = c_{m-1}) of the piecewise-linear
// approximation into the slope increments a.
func slopesFromNodal(c, y []float64) []float64 {
	m := len(c)
	a := make([]float64, m)
	prev := 0.0
	for j := 0; j+1 < m; j++ {
		s := (y[j+1] - y[j]) / (c[j+1] - c[j])
		a[j] = s - prev
		prev = s
	}
	a[m-1] = 1 - prev
	return a
}

// Gauss-Legendre quadrature, glN points on [-1, 1], applied on pieces of length at most quadPiece.
const (
	glN       = 20
	quadPiece = 1.0
)

var glX, glW = gaussLegendre(glN)

// gaussLegendre returns the n nodes and weights on [-1, 1] (Newton iteration on the Legendre recurrence).
func gaussLegendre(n int) (x, w []float64) {
	x, w = make([]float64, n), make([]float64, n)
	for i := 0; i < (n+1)/2; i++ {
		z := math.Cos(math.Pi * (float64(i) + 0.75) / (float64(n) + 0.5))
		var pp float64
		for iter := 0; iter < 100; iter++ {
			p1, p2 := 1.0, 0.0
			for j := 1; j <= n; j++ {
				p3 := p2
				p2 = p1
				p1 = ((2*float64(j)-1)*z*p2 - (float64(j)-1)*p3) / float64(j)
			}
			pp = float64(n) * (z*p1 - p2) / (z*z - 1)
			dz := p1 / pp
			z -= dz
			if math.Abs(dz) < 1e-16 {
				break
			}
		}
		// Recompute the derivative at the converged node for the weight.
		p1, p2 := 1.0, 0.0
		for j := 1; j <= n; j++ {
			p3 := p2
			p2 = p1
			p1 = ((2*float64(j)-1)*z*p2 - (float64(j)-1)*p3) / float64(j)
		}
		pp = float64(n) * (z*p1 - p2) / (z*z - 1)
		x[i], x[n-1-i] = -z, z
		w[i] = 2 / ((1 - z*z) * pp * pp)
		w[n-1-i] = w[i]
	}
	return x, w
}

// quadPoints appends the composite Gauss-Legendre nodes and weights for [a, b] to xs and ws.
func quadPoints(a, b float64, xs, ws []float64) ([]float64, []float64) {
	if !(b > a) {
		return xs, ws
	}
	pieces := int(math.Ceil((b - a) / quadPiece))
	if pieces < 1 {
		pieces = 1
	}
	step := (b - a) / float64(pieces)
	for p := 0; p < pieces; p++ {
		left := a + float64(p)*step
		right := left + step
		if p == pieces-1 {
			right = b
		}
		mid, half := (left+right)/2, (right-left)/2
		for i := range glX {
			xs = append(xs, mid+half*glX[i])
			ws = append(ws, half*glW[i])
		}
	}
	return xs, ws
}

// integrate returns the integral of f over [a, b] (0 when b <= a).
func integrate(f func(float64) float64, a, b float64) float64 {
	xs, ws := quadPoints(a, b, nil, nil)
	sum := 0.0
	for i := range xs {
		sum += ws[i] * f(xs[i])
	}
	return sum
}

// fitter evaluates F(c) = min_a J(a, c) and its gradient for one activation and window.
type fitter struct {
	h      func(float64) float64
	lo, hi float64
	// Scratch, reused between evaluations.
	xs, ws, hs []float64
	first      []int // first[j] is the index in xs of the first node of the interval [c_j, c_{j+1}]
}

// eval solves the projection for the ascending breakpoints c and returns the objective F (when wantF),
// its gradient with respect to c (when wantGrad) and the nodal values y of the optimal approximation.
func (f *fitter) eval(c []float64, wantF, wantGrad bool) (F float64, grad, y []float64, err error) {
	m := len(c)
	f.xs, f.ws, f.first = f.xs[:0], f.ws[:0], f.first[:0]
	for j := 0; j+1 < m; j++ {
		f.first = append(f.first, len(f.xs))
		f.xs, f.ws = quadPoints(c[j], c[j+1], f.xs, f.ws)
	}
	f.first = append(f.first, len(f.xs))
	f.hs = f.hs[:0]
	for _, x := range f.xs {
		f.hs = append(f.hs, f.h(x))
	}

	// Load vector f_j = int h phi_j and the tridiagonal mass matrix.
	load := make([]float64, m)
	diag := make([]float64, m)
	off := make([]float64, m) // off[j] = M_{j,j+1}
	for j := 0; j+1 < m; j++ {
		d := c[j+1] - c[j]
		for p := f.first[j]; p < f.first[j+1]; p++ {
			t := (f.xs[p] - c[j]) / d
			wh := f.ws[p] * f.hs[p]
			load[j] += wh * (1 - t)
			load[j+1] += wh * t
		}
		diag[j] += d / 3
		diag[j+1] += d / 3
		off[j] = d / 6
	}

	// Solve for the interior nodal values y_1 .. y_{m-2} (Thomas algorithm; M is SPD and diagonally dominant).
	y = make([]float64, m)
	y[0], y[m-1] = 0, c[m-1]
	if n := m - 2; n > 0 {
		rhs := make([]float64, n)
		for i := 0; i < n; i++ {
			rhs[i] = load[i+1]
		}
		rhs[0] -= off[0] * y[0]
		rhs[n-1] -= off[m-2] * y[m-1]
		cp := make([]float64, n)
		dp := make([]float64, n)
		for i := 0; i < n; i++ {
			den := diag[i+1]
			if i > 0 {
				den -= off[i] * cp[i-1]
			}
			if i < n-1 {
				cp[i] = off[i+1] / den
			}
			dp[i] = rhs[i]
			if i > 0 {
				dp[i] -= off[i] * dp[i-1]
			}
			dp[i] /= den
		}
		for i := n - 1; i >= 0; i-- {
			y[i+1] = dp[i]
			if i < n-1 {
				y[i+1] -= cp[i] * y[i+2]
			}
		}
	}

	if wantGrad {
		grad = make([]float64, m)
	}
	if wantF || wantGrad {
		for j := 0; j+1 < m; j++ {
			d := c[j+1] - c[j]
			s := (y[j+1] - y[j]) / d
			var rl, rr float64 // int (h-g) phi_j, int (h-g) phi_{j+1} over the interval
			for p := f.first[j]; p < f.first[j+1]; p++ {
				t := (f.xs[p] - c[j]) / d
				r := f.hs[p] - (y[j]*(1-t) + y[j+1]*t)
				F += f.ws[p] * r * r
				rl += f.ws[p] * r * (1 - t)
				rr += f.ws[p] * r * t
			}
			if wantGrad {
				grad[j] += 2 * s * rl
				grad[j+1] += 2 * s * rr
				if j == m-2 {
					grad[m-1] -= 2 * rr
				}
			}
		}
	}
	if wantF {
		h := f.h
		F += integrate(func(x float64) float64 { v := h(x); return v * v }, f.lo, c[0])
		F += integrate(func(x float64) float64 { v := h(x) - x; return v * v }, c[m-1], f.hi)
	}
	if !isFinite(F) || !allFinite(y) || (wantGrad && !allFinite(grad)) {
		return 0, nil, nil, errors.New("objective is not finite (does h return NaN or Inf?)")
	}
	return F, grad, y, nil
}

func allFinite(v []float64) bool {
	for _, x := range v {
		if !isFinite(x) {
			return false
		}
	}
	return true
}

func maxAbs(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, math.Abs(x))
	}
	return m
}

// valid reports whether c is strictly ascending with gaps of at least minGap and inside the window.
func (f *fitter) valid(c []float64, minGap float64) bool {
	if !allFinite(c) || c[0] < f.lo || c[len(c)-1] > f.hi {
		return false
	}
	for i := 1; i < len(c); i++ {
		if !(c[i]-c[i-1] >= minGap) {
			return false
		}
	}
	return true
}

// hessian returns the central-difference Jacobian of the analytic gradient at c, symmetrised.
func (f *fitter) hessian(c []float64) ([][]float64, error) {
	m := len(c)
	minGap := math.Inf(1)
	for i := 1; i < m; i++ {
		minGap = math.Min(minGap, c[i]-c[i-1])
	}
	eps := math.Min(1e-5, minGap/4)
	H := make([][]float64, m)
	for i := range H {
		H[i] = make([]float64, m)
	}
	cp := append([]float64(nil), c...)
	for j := 0; j < m; j++ {
		cp[j] = c[j] + eps
		_, gp, _, err := f.eval(cp, false, true)
		if err != nil {
			return nil, err
		}
		cp[j] = c[j] - eps
		_, gm, _, err := f.eval(cp, false, true)
		if err != nil {
			return nil, err
		}
		cp[j] = c[j]
		for i := 0; i < m; i++ {
			H[i][j] = (gp[i] - gm[i]) / (2 * eps)
		}
	}
	for i := 0; i < m; i++ {
		for j := i + 1; j < m; j++ {
			v := (H[i][j] + H[j][i]) / 2
			H[i][j], H[j][i] = v, v
		}
	}
	return H, nil
}

// choleskySolve solves (H + mu I) x = b; ok is false when the shifted matrix is not positive definite.
func choleskySolve(H [][]float64, mu float64, b []float64) (x []float64, ok bool) {
	n := len(b)
	L := make([][]float64, n)
	for i := range L {
		L[i] = make([]float64, n)
	}
	for i := 0; i < n; i++ {
		for j := 0; j <= i; j++ {
			s := H[i][j]
			if i == j {
				s += mu
			}
			for k := 0; k < j; k++ {
				s -= L[i][k] * L[j][k]
			}
			if i == j {
				if !(s > 0) {
					return nil, false
				}
				L[i][i] = math.Sqrt(s)
			} else {
				L[i][j] = s / L[j][j]
			}
		}
	}
	z := make([]float64, n)
	for i := 0; i < n; i++ {
		s := b[i]
		for k := 0; k < i; k++ {
			s -= L[i][k] * z[k]
		}
		z[i] = s / L[i][i]
	}
	x = make([]float64, n)
	for i := n - 1; i >= 0; i-- {
		s := z[i]
		for k := i + 1; k < n; k++ {
			s -= L[k][i] * x[k]
		}
		x[i] = s / L[i][i]
	}
	return x, true
}

// minimize runs the damped Newton iteration on the breakpoints from start. It returns the final
// breakpoints, the max-abs gradient there, the number of accepted steps and whether the gradient
// tolerance was reached.
func (f *fitter) minimize(start []float64, maxIter int) (c []float64, gnorm float64, iters int, converged bool, err error) {
	c = append([]float64(nil), start...)
	minGap := 1e-6 * (f.hi - f.lo)
	maxStep := (f.hi - f.lo) / 8
	F, g, _, err := f.eval(c, true, true)
	if err != nil {
		return nil, 0, 0, false, err
	}
	gnorm = maxAbs(g)
	mu := 0.0
	for iters < maxIter {
		if gnorm <= FitGradientTol {
			return c, gnorm, iters, true, nil
		}
		H, err := f.hessian(c)
		if err != nil {
			return nil, 0, 0, false, err
		}
		scale := 0.0
		for i := range H {
			scale = math.Max(scale, math.Abs(H[i][i]))
		}
		if scale == 0 {
			scale = 1
		}
		negG := make([]float64, len(g))
		for i := range g {
			negG[i] = -g[i]
		}
		accepted := false
		for try := 0; try < 60; try++ {
			step, ok := choleskySolve(H, mu, negG)
			if !ok {
				mu = math.Max(10*mu, 1e-10*scale)
				continue
			}
			if s := maxAbs(step); s > maxStep {
				for i := range step {
					step[i] *= maxStep / s
				}
			}
			trial := make([]float64, len(c))
			for i := range c {
				trial[i] = c[i] + step[i]
			}
			if !f.valid(trial, minGap) {
				mu = math.Max(10*mu, 1e-10*scale)
				continue
			}
			Ft, gt, _, err := f.eval(trial, true, true)
			if err != nil {
				return nil, 0, 0, false, err
			}
			gt2 := maxAbs(gt)
			// Accept a decrease of F; once F is flat to rounding, accept a decrease of the gradient.
			if Ft < F || (Ft <= F+1e-13*math.Abs(F) && gt2 < gnorm) {
				c, F, g, gnorm = trial, Ft, gt, gt2
				mu /= 10
				if mu < 1e-14*scale {
					mu = 0
				}
				accepted = true
				break
			}
			mu = math.Max(10*mu, 1e-10*scale)
		}
		if !accepted {
			// No step improves F or the gradient any more: the iteration sits at the rounding floor,
			// which counts as converged when the gradient is already tiny.
			return c, gnorm, iters, gnorm <= fitStallTol, nil
		}
		iters++
	}
	return c, gnorm, iters, gnorm <= FitGradientTol, nil
}

// Multi-start search.

const (
	// fitStallTol is the gradient below which a local run that cannot improve further counts as converged.
	fitStallTol = 1e-9
	// fitTieTol is the relative objective difference below which two local optima count as tied.
	fitTieTol = 1e-9
	// startCells is the number of grid cells on which the knot density is tabulated.
	startCells = 4096
	// maxCompositions caps the number of region compositions screened.
	maxCompositions = 5000
)

func sum(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s
}

// knotDensity tabulates rho = |d2h|^(2/5), d2h being the second derivative of h (a second difference), on
// a grid over the window: the asymptotically optimal knot density of a free-knot piecewise-linear L2
// approximation. It also splits the window into regions at the sign changes of d2h (the inflection
// points of h).
type knotDensity struct {
	lo, dx  float64
	cum     []float64 // cum[i] = mass of rho on cells 0 .. i-1 (startCells + 1 entries)
	regions [][2]int  // regions as [first edge, last edge] in cell-edge indices, covering the window
}

func newKnotDensity(h func(float64) float64, lo, hi float64) (*knotDensity, error) {
	n := startCells
	dx := (hi - lo) / float64(n)
	e := dx / 2
	d2 := make([]float64, n)
	maxD2 := 0.0
	for i := range d2 {
		x := lo + (float64(i)+0.5)*dx
		d2[i] = (h(x+e) - 2*h(x) + h(x-e)) / (e * e)
		if !isFinite(d2[i]) {
			return nil, fmt.Errorf("activation is not finite near x = %g", x)
		}
		maxD2 = math.Max(maxD2, math.Abs(d2[i]))
	}
	// Second differences below tau are rounding noise (or flat tails): no density, no sign.
	tau := 1e-6 * maxD2
	d := &knotDensity{lo: lo, dx: dx, cum: make([]float64, n+1)}
	lastSign, lastIdx, regionStart := 0, -1, 0
	for i, v := range d2 {
		rho := 0.0
		if maxD2 == 0 {
			rho = 1 // h is linear: uniform density
		} else if math.Abs(v) >= tau {
			rho = math.Pow(math.Abs(v), 0.4)
			sign := 1
			if v < 0 {
				sign = -1
			}
			if lastSign != 0 && sign != lastSign {
				edge := (lastIdx + 1 + i) / 2
				d.regions = append(d.regions, [2]int{regionStart, edge})
				regionStart = edge
			}
			lastSign, lastIdx = sign, i
		}
		d.cum[i+1] = d.cum[i] + rho
	}
	d.regions = append(d.regions, [2]int{regionStart, n})
	return d, nil
}

// place returns n points in the region between cell edges s and e at the (j + 1/2)/n quantiles of the
// density (uniformly when the region has no mass).
func (d *knotDensity) place(n, s, e int) []float64 {
	out := make([]float64, n)
	mass := d.cum[e] - d.cum[s]
	for j := range out {
		q := (float64(j) + 0.5) / float64(n)
		if !(mass > 0) {
			out[j] = d.lo + d.dx*(float64(s)+q*float64(e-s))
			continue
		}
		target := d.cum[s] + q*mass
		// First edge i in (s, e] with cum[i] >= target; the point lies in cell i-1.
		i := s + 1 + sort.Search(e-s, func(k int) bool { return d.cum[s+1+k] >= target })
		if i > e {
			i = e
		}
		frac := 0.0
		if w := d.cum[i] - d.cum[i-1]; w > 0 {
			frac = (target - d.cum[i-1]) / w
		}
		out[j] = d.lo + d.dx*(float64(i-1)+frac)
	}
	return out
}

// multiStarts returns the starting breakpoints for the multi-start search: the breakpoints equidistributing
// the knot density over the whole window, plus the `candidates` best (by objective) of the starts that
// distribute the m knots over the regions between inflection points in every possible way (equidistributed
// within each region).
func (f *fitter) multiStarts(m, candidates int) ([][]float64, error) {
	d, err := newKnotDensity(f.h, f.lo, f.hi)
	if err != nil {
		return nil, err
	}
	minGap := 1e-6 * (f.hi - f.lo)
	global := d.place(m, 0, startCells)
	starts := [][]float64{}
	if f.valid(global, minGap) {
		starts = append(starts, global)
	}

	// Number of compositions of m into len(regions) non-negative parts: C(m + R - 1, R - 1).
	R := len(d.regions)
	count := 1.0
	for i := 1; i < R; i++ {
		count = count * float64(m+i) / float64(i)
	}
	type scored struct {
		c []float64
		F float64
	}
	var screened []scored
	if R > 1 && count <= maxCompositions {
		parts := make([]int, R)
		var rec func(r, left int) error
		rec = func(r, left int) error {
			if r == R-1 {
				parts[r] = left
				var c []float64
				for k, reg := range d.regions {
					c = append(c, d.place(parts[k], reg[0], reg[1])...)
				}
				if !f.valid(c, minGap) {
					return nil
				}
				F, _, _, err := f.eval(c, true, false)
				if err != nil {
					return err
				}
				screened = append(screened, scored{c, F})
				return nil
			}
			for p := 0; p <= left; p++ {
				parts[r] = p
				if err := rec(r+1, left-p); err != nil {
					return err
				}
			}
			return nil
		}
		if err := rec(0, m); err != nil {
			return nil, err
		}
	}
	sort.SliceStable(screened, func(i, j int) bool { return screened[i].F < screened[j].F })
	for i := 0; i < len(screened) && i < candidates; i++ {
		starts = append(starts, screened[i].c)
	}
	if len(starts) == 0 {
		// Degenerate density: fall back to uniform breakpoints over the middle half of the window.
		c := make([]float64, m)
		for i := range c {
			c[i] = f.lo + (f.hi-f.lo)*(0.25+0.5*float64(i)/float64(m-1))
		}
		starts = append(starts, c)
	}
	return starts, nil
}
