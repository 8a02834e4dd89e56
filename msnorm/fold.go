package msnorm

import (
	"fmt"
	"math"
)

// Dense is a linear layer's weights on the host, in the Hugging Face layout: W is [Out, In] row-major and B is
// [Out], or nil when the layer has no bias.
type Dense struct {
	Out, In int
	W, B    []float32
}

// NormAffine is a norm's affine transform: y = z * Gamma + Beta, or z * (1 + Gamma) + Beta when PlusOne (Gemma
// style). Beta may be nil.
type NormAffine struct {
	Gamma, Beta []float32
	PlusOne     bool
}

func (n NormAffine) scale(i int) float64 {
	if n.PlusOne {
		return 1 + float64(n.Gamma[i])
	}
	return float64(n.Gamma[i])
}

func (n NormAffine) hasBeta() bool {
	for _, b := range n.Beta {
		if b != 0 {
			return true
		}
	}
	return false
}

func check(n NormAffine, l Dense) error {
	if l.Out <= 0 || l.In <= 0 || len(l.W) != l.Out*l.In {
		return fmt.Errorf("msnorm: linear weight has %d values, want [%d, %d]", len(l.W), l.Out, l.In)
	}
	if l.B != nil && len(l.B) != l.Out {
		return fmt.Errorf("msnorm: linear bias has %d values, want %d", len(l.B), l.Out)
	}
	if len(n.Gamma) != l.In {
		return fmt.Errorf("msnorm: norm weight has %d values but the linear layer takes %d inputs", len(n.Gamma), l.In)
	}
	if n.Beta != nil && len(n.Beta) != l.In {
		return fmt.Errorf("msnorm: norm bias has %d values but the linear layer takes %d inputs", len(n.Beta), l.In)
	}
	return nil
}

// Fold moves the norm's affine into the linear layer that consumes the norm's output:
//
//	W (z * g + beta) + b = (W diag(g)) z + (b + W beta),   g = gamma (or 1 + gamma)
//
// so W' = W diag(g) and b' = b + W beta. A bias is added when the layer had none and beta is not zero. The bias
// sum is accumulated in float64. The inputs are not modified.
func Fold(n NormAffine, l Dense) (Dense, error) {
	if err := check(n, l); err != nil {
		return Dense{}, err
	}
	out := Dense{Out: l.Out, In: l.In, W: make([]float32, len(l.W))}
	for o := 0; o < l.Out; o++ {
		row := l.W[o*l.In : (o+1)*l.In]
		for i, w := range row {
			out.W[o*l.In+i] = float32(float64(w) * n.scale(i))
		}
	}
	if l.B != nil || n.hasBeta() {
		out.B = make([]float32, l.Out)
		for o := 0; o < l.Out; o++ {
			s := 0.0
			if l.B != nil {
				s = float64(l.B[o])
			}
			if n.Beta != nil {
				row := l.W[o*l.In : (o+1)*l.In]
				for i, w := range row {
					s += float64(w) * float64(n.Beta[i])
				}
			}
			out.B[o] = float32(s)
		}
	}
	return out, nil
}

// Unfold reverses Fold: given the folded layer (W', b') and the original affine, it returns W = W' diag(1/g) and
// b = b' - W beta. It fails if some g is zero (that input channel was erased by the norm and cannot be
// recovered). The result has a bias whenever the folded layer has one; if the original layer had none, its
// recovered bias is zero up to rounding and the caller may drop it.
func Unfold(n NormAffine, l Dense) (Dense, error) {
	if err := check(n, l); err != nil {
		return Dense{}, err
	}
	for i := 0; i < l.In; i++ {
		if n.scale(i) == 0 || math.IsNaN(n.scale(i)) {
			return Dense{}, fmt.Errorf("msnorm: cannot unfold: norm scale of input %d is %g", i, n.scale(i))
		}
	}
	out := Dense{Out: l.Out, In: l.In, W: make([]float32, len(l.W))}
	for o := 0; o < l.Out; o++ {
		for i := 0; i < l.In; i++ {
			out.W[o*l.In+i] = float32(float64(l.W[o*l.In+i]) / n.scale(i))
		}
	}
	if l.B != nil {
		out.B = make([]float32, l.Out)
		for o := 0; o < l.Out; o++ {
			s := float64(l.B[o])
			if n.Beta != nil {
				for i := 0; i < l.In; i++ {
					s -= float64(l.W[o*l.In+i]) / n.scale(i) * float64(n.Beta[i])
				}
			}
			out.B[o] = float32(s)
		}
	}
	return out, nil
}
