package approxbp

import (
	"fmt"
	"math"
	"sort"
)

// Coefficients define a k-bit ReLU-formed approximation of an activation h:
//
//	h~(x) = sum_i A[i] * max(x - C[i], 0),   i = 0 .. 2^k - 2,   with sum A = 1 and sum A[i]*C[i] = 0.
//
// Its derivative is a step function with 2^k levels, so the backward pass needs only the k-bit code
// code(x) = #{i : x > C[i]} of each element: slope(code) = A[0] + ... + A[code-1] (0 for code 0).
// The two constraints make h~ vanish for x -> -inf and equal x for x -> +inf, like GELU and SiLU.
type Coefficients struct {
	// Name identifies the approximation in reports ("ReGELU2", "ReSiLU2", ...).
	Name string
	// Bits is k: the code of each element takes k bits and there are 2^k - 1 breakpoints.
	Bits int
	// A are the slope increments, one per breakpoint.
	A []float64
	// C are the breakpoints, in ascending order.
	C []float64
}

// ReGELU2Coefficients are the published Approx-BP coefficients for GELU (k = 2), found by the paper's simulated
// annealing.
var ReGELU2Coefficients = Coefficients{
	Name: "ReGELU2",
	Bits: 2,
	A:    []float64{-0.04922261145617846, 1.0979632065417297, -0.048740595085551286},
	C:    []float64{-3.1858810036855245, -0.001178821281161997, 3.190832613414926},
}

// ReSiLU2Coefficients are the published Approx-BP coefficients for SiLU (k = 2).
var ReSiLU2Coefficients = Coefficients{
	Name: "ReSiLU2",
	Bits: 2,
	A:    []float64{-0.04060357190528599, 1.080925428529668, -0.040321856624382146},
	C:    []float64{-6.3050461001646445, -0.0008684942046214787, 6.325815242089708},
}

// ReGELU2TanhCoefficients are 2-bit coefficients for GELU's tanh form (gelu_pytorch_tanh, Gemma's MLP), fitted
// by this package's Fit on [-GELURange, GELURange]: FitGELUTanh(2), 7 local Newton runs from the deterministic
// multi-start, 5 iterations in the best, gradient 7.1e-13, objective (the integral of (h - h~)² over the window)
// 0.0095522 against 0.0095560 for the published ReGELU2 coefficients on the same function
// (TestReGELU2TanhIsFitted refits them). The tanh form is within 4.7e-4 of the erf GELU, so these are close to
// the erf fit's (FitGELU(2): breakpoints ±3.1713, here ±3.1629).
var ReGELU2TanhCoefficients = Coefficients{
	Name: "ReGELU2-tanh",
	Bits: 2,
	A:    []float64{-0.049786133062307, 1.0995722661246146, -0.0497861330623075},
	C:    []float64{-3.1628800664153705, 8.184337213803436e-16, 3.1628800664153554},
}

// Levels returns the 2^k slope values of the step derivative, indexed by code.
func (c Coefficients) Levels() []float64 {
	levels := make([]float64, len(c.A)+1)
	for i, a := range c.A {
		levels[i+1] = levels[i] + a
	}
	return levels
}

// Validate checks the shape of the coefficients and the two constraints (to 1e-6).
func (c Coefficients) Validate() error {
	if c.Bits < 1 || c.Bits > 4 {
		return fmt.Errorf("approxbp: %s: bits must be 1..4, got %d", c.Name, c.Bits)
	}
	n := 1<<c.Bits - 1
	if len(c.A) != n || len(c.C) != n {
		return fmt.Errorf("approxbp: %s: %d-bit coefficients need %d slopes and %d breakpoints, got %d and %d",
			c.Name, c.Bits, n, n, len(c.A), len(c.C))
	}
	if !sort.Float64sAreSorted(c.C) {
		return fmt.Errorf("approxbp: %s: breakpoints must be ascending, got %v", c.Name, c.C)
	}
	var sumA, sumAC float64
	for i := range c.A {
		if math.IsNaN(c.A[i]) || math.IsNaN(c.C[i]) || math.IsInf(c.A[i], 0) || math.IsInf(c.C[i], 0) {
			return fmt.Errorf("approxbp: %s: coefficients must be finite", c.Name)
		}
		sumA += c.A[i]
		sumAC += c.A[i] * c.C[i]
	}
	if math.Abs(sumA-1) > 1e-6 || math.Abs(sumAC) > 1e-6 {
		return fmt.Errorf("approxbp: %s: constraints violated: sum A = %g (want 1), sum A*C = %g (want 0)", c.Name, sumA, sumAC)
	}
	return nil
}

// Eval returns h~(x), the ReLU-formed approximation itself (float64, for fitting and reports).
func (c Coefficients) Eval(x float64) float64 {
	s := 0.0
	for i := range c.A {
		if x > c.C[i] {
			s += c.A[i] * (x - c.C[i])
		}
	}
	return s
}

// Code returns the k-bit code of x: the number of breakpoints strictly below x.
func (c Coefficients) Code(x float64) int {
	code := 0
	for _, ci := range c.C {
		if x > ci {
			code++
		}
	}
	return code
}

// GELU64 is the exact (erf) GELU in float64: x * Phi(x).
func GELU64(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }

// GELUTanh64 is GELU's tanh form in float64: x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))) / 2.
func GELUTanh64(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(tanhGELUSqrt2OverPi*(x+tanhGELUCubic*x*x*x)))
}

// SiLU64 is SiLU in float64: x * sigmoid(x).
func SiLU64(x float64) float64 { return x / (1 + math.Exp(-x)) }
