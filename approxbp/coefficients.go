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

// SiLU64 is SiLU in float64: x * sigmoid(x).
func SiLU64(x float64) float64 { return x / (1 + math.Exp(-x)) }
