// Package approxbp implements approximate backpropagation for GELU and SiLU (Approx-BP): the forward pass is the
// exact activation, and the backward pass uses the derivative of a ReLU-formed approximation, a step function
// with 2^k levels, so only a k-bit code per element is kept between forward and backward instead of the
// full-precision input.
//
// ReGELU2 and ReSiLU2 (k = 2) use the paper's published coefficients (ReGELU2Coefficients, ReSiLU2Coefficients);
// Approx takes any Coefficients (k = 1..4), and Fit solves the paper's objective for new ones. GELU and SiLU with
// their exact gradients (keeping only the input) are provided beside them as the baselines.
package approxbp
