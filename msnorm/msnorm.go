package msnorm

import (
	"fmt"

	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// MSLayerNorm returns z = (x - mean(x)) * rstd over the last axis, rstd = 1/sqrt(var(x) + eps), with no affine.
//
// Backward. With g = dL/dz, D the normalised size, z_j = (x_j - mu) r and r = (sigma² + eps)^(-1/2):
// d mu/dx_i = 1/D and d r/dx_i = -r³ (x_i - mu) / D = -r² z_i / D, so
//
//	dz_j/dx_i = r (delta_ij - 1/D) - (x_j - mu) r² z_i / D = r (delta_ij - 1/D - z_i z_j / D)
//
// and summing g_j dz_j/dx_i over j:
//
//	dL/dx = r * (g - mean(g) - mean(g * z) * z)
//
// which reads only z (this node's output) and r ([..., 1]). The centring node passes that gradient straight to
// x, so neither x nor x - mean is kept.
func MSLayerNorm(x *graph.Node, eps float64) *graph.Node {
	checkInput("MSLayerNorm", x)
	mean := graph.ReduceAndKeep(x, graph.ReduceMean, -1)
	centred := engine.PassThrough(graph.Sub(x, mean), engine.KindNorm, 0)
	variance := graph.ReduceAndKeep(graph.Square(centred), graph.ReduceMean, -1)
	rstd := graph.Rsqrt(graph.AddScalar(variance, eps))
	z := graph.Mul(centred, rstd)
	return engine.SetVJP(z, engine.KindNorm, func(z, g *graph.Node) []*graph.Node {
		r := z.Inputs()[1]
		z = engine.Fresh(z) // an int8 copy under Mesa
		meanG := graph.ReduceAndKeep(g, graph.ReduceMean, -1)
		meanGZ := graph.ReduceAndKeep(graph.Mul(g, z), graph.ReduceMean, -1)
		dx := graph.Mul(r, graph.Sub(graph.Sub(g, meanG), graph.Mul(meanGZ, z)))
		return []*graph.Node{dx, nil}
	})
}

// MSRMSNorm returns z = x * rstd over the last axis, rstd = 1/sqrt(mean(x²) + eps), with no affine.
//
// Backward. With z_j = x_j r and r = (mean(x²) + eps)^(-1/2): d r/dx_i = -r³ x_i / D = -r² z_i / D, so
// dz_j/dx_i = r delta_ij - x_j r² z_i / D = r (delta_ij - z_i z_j / D), and
//
//	dL/dx = r * (g - mean(g * z) * z)
//
// reading only z and r.
func MSRMSNorm(x *graph.Node, eps float64) *graph.Node {
	checkInput("MSRMSNorm", x)
	rstd := graph.Rsqrt(graph.AddScalar(graph.ReduceAndKeep(graph.Square(x), graph.ReduceMean, -1), eps))
	z := graph.Mul(x, rstd)
	return engine.SetVJP(z, engine.KindNorm, func(z, g *graph.Node) []*graph.Node {
		r := z.Inputs()[1]
		z = engine.Fresh(z) // an int8 copy under Mesa
		meanGZ := graph.ReduceAndKeep(graph.Mul(g, z), graph.ReduceMean, -1)
		dx := graph.Mul(r, graph.Sub(g, graph.Mul(meanGZ, z)))
		return []*graph.Node{dx, nil}
	})
}

// LayerNorm is the plain LayerNorm with affine, y = z * gamma + beta with z = MSLayerNorm(x); beta may be nil.
// The backward keeps z (and rstd) for the norm and the affine together; a linear layer that consumes y keeps y
// as well, which is the memory MS-LN saves.
func LayerNorm(x, gamma, beta *graph.Node, eps float64) *graph.Node {
	return Affine(MSLayerNorm(x, eps), gamma, beta, false)
}

// RMSNorm is the plain RMSNorm with affine, y = z * gamma (z * (1 + gamma) when plusOne, as in Gemma).
func RMSNorm(x, gamma *graph.Node, eps float64, plusOne bool) *graph.Node {
	return Affine(MSRMSNorm(x, eps), gamma, nil, plusOne)
}

// Affine returns z * gamma + beta (z * (1 + gamma) + beta when plusOne) with gamma and beta of shape [D] scaling
// the last axis of z; beta may be nil.
//
// Backward: dz = v * gamma (gamma re-read from its own node, the parameter, not a broadcast copy),
// dgamma = sum over the leading axes of v * z, dbeta = sum of v. It keeps z only.
func Affine(z, gamma, beta *graph.Node, plusOne bool) *graph.Node {
	d := z.Shape().Dim(-1)
	if gamma == nil || gamma.Rank() != 1 || gamma.Shape().Dim(0) != d {
		panic(fmt.Sprintf("msnorm: gamma must have shape [%d]", d))
	}
	if beta != nil && (beta.Rank() != 1 || beta.Shape().Dim(0) != d) {
		panic(fmt.Sprintf("msnorm: beta must have shape [%d]", d))
	}
	scale := gamma
	if plusOne {
		scale = graph.OnePlus(gamma)
	}
	rank := z.Rank()
	y := graph.Mul(z, graph.ExpandLeftToRank(scale, rank))
	engine.SetVJP(y, engine.KindNorm, func(y, v *graph.Node) []*graph.Node {
		z := engine.Fresh(y.Inputs()[0]) // an int8 copy under Mesa
		// Re-expand the scale from its source inside the backward, so no forward broadcast is kept.
		s := graph.ExpandLeftToRank(scale, rank)
		leading := make([]int, rank-1)
		for i := range leading {
			leading[i] = i
		}
		dScale := graph.ReduceAndKeep(graph.Mul(v, z), graph.ReduceSum, leading...)
		return []*graph.Node{graph.Mul(v, s), dScale}
	})
	if beta == nil {
		return y
	}
	return engine.SetKind(graph.Add(y, graph.ExpandLeftToRank(beta, rank)), engine.KindNorm)
}

func checkInput(name string, x *graph.Node) {
	if !x.DType().IsFloat() || x.Rank() < 1 {
		panic(fmt.Sprintf("msnorm.%s: needs a float tensor of rank >= 1, got %s", name, x.Shape()))
	}
}
