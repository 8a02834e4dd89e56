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

// Scale returns g_i, the factor input channel i is multiplied by: Gamma[i], or 1 + Gamma[i] when PlusOne.
func (n NormAffine) Scale(i int) float64 {
	if n.PlusOne {
		return 1 + float64(n.Gamma[i])
	}
	return float64(n.Gamma[i])
}

// HasBeta reports whether the affine has a non-zero shift.
func (n NormAffine) HasBeta() bool {
	for _, b := range n.Beta {
		if b != 0 {
			return true
		}
	}
	return false
}

// IsIdentity reports whether the affine is y = z: every g_i is 1 and there is no shift. A change of basis under
// such a norm changes nothing.
func (n NormAffine) IsIdentity() bool {
	for i := range n.Gamma {
		if n.Scale(i) != 1 {
			return false
		}
	}
	return !n.HasBeta()
}

// The change of input basis, derived once for every user (Fold and Unfold of the base layer, and adapters that
// read the layer's input, through InputToOriginal and InputToFolded).
//
// With MS-norm a layer fed by a norm reads z, the norm's output without its affine, while the original model's
// layer reads u = g ∘ z + beta. A map M (rows × In) applied to z is, written on u,
//
//	M z = M diag(1/g) (u - beta) = M_u u - M_u beta,        M_u = M diag(1/g),
//
// and conversely a map M_u on u is, written on z,
//
//	M_u u = M_u diag(g) z + M_u beta = M z + M_u beta,      M = M_u diag(g).
//
// Both directions return the offset o = M_u beta (rows values, nil without beta): what the map on u adds that
// the map on z does not. Folding a layer (W, b) is M_u = W, b' = b + o; unfolding is M = W', b = b' - o. A
// LoRA A matrix changes the same way, its offset going through B into a bias. g_i = 0 erases channel i and
// cannot be undone: InputToOriginal refuses it.

// InputToOriginal returns M_u = M diag(1/g) and the offset M_u beta for the rows×In matrix m that reads the
// folded input z.
func (n NormAffine) InputToOriginal(m []float32, rows int) ([]float32, []float64, error) {
	in, err := n.checkMatrix(m, rows)
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i < in; i++ {
		if g := n.Scale(i); g == 0 || math.IsNaN(g) || math.IsInf(g, 0) {
			return nil, nil, fmt.Errorf("msnorm: cannot unfold: norm scale of input %d is %g", i, g)
		}
	}
	out := make([]float32, len(m))
	for r := 0; r < rows; r++ {
		for i := 0; i < in; i++ {
			out[r*in+i] = float32(float64(m[r*in+i]) / n.Scale(i))
		}
	}
	return out, n.offset(out, rows, in), nil
}

// InputToFolded returns M = M_u diag(g) and the offset M_u beta for the rows×In matrix mu that reads the
// original input u.
func (n NormAffine) InputToFolded(mu []float32, rows int) ([]float32, []float64, error) {
	in, err := n.checkMatrix(mu, rows)
	if err != nil {
		return nil, nil, err
	}
	out := make([]float32, len(mu))
	for r := 0; r < rows; r++ {
		for i := 0; i < in; i++ {
			out[r*in+i] = float32(float64(mu[r*in+i]) * n.Scale(i))
		}
	}
	return out, n.offset(mu, rows, in), nil
}

// offset returns mu · beta in float64 (nil without a shift).
func (n NormAffine) offset(mu []float32, rows, in int) []float64 {
	if !n.HasBeta() {
		return nil
	}
	o := make([]float64, rows)
	for r := 0; r < rows; r++ {
		s := 0.0
		for i := 0; i < in; i++ {
			s += float64(mu[r*in+i]) * float64(n.Beta[i])
		}
		o[r] = s
	}
	return o
}

func (n NormAffine) checkMatrix(m []float32, rows int) (int, error) {
	in := len(n.Gamma)
	if in == 0 || rows <= 0 || len(m) != rows*in {
		return 0, fmt.Errorf("msnorm: matrix has %d values, want [%d, %d] (the norm has %d channels)", len(m), rows, in, in)
	}
	if n.Beta != nil && len(n.Beta) != in {
		return 0, fmt.Errorf("msnorm: norm bias has %d values but its weight %d", len(n.Beta), in)
	}
	return in, nil
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

// Fold moves the norm's affine into the linear layer that consumes the norm's output (the change of basis above
// with M_u = W):
//
//	W (z * g + beta) + b = (W diag(g)) z + (b + W beta),   g = gamma (or 1 + gamma)
//
// so W' = W diag(g) and b' = b + W beta. A bias is added when the layer had none and beta is not zero. The bias
// sum is accumulated in float64. The inputs are not modified.
func Fold(n NormAffine, l Dense) (Dense, error) {
	if err := check(n, l); err != nil {
		return Dense{}, err
	}
	w, offset, err := n.InputToFolded(l.W, l.Out)
	if err != nil {
		return Dense{}, err
	}
	return Dense{Out: l.Out, In: l.In, W: w, B: AddOffset(l.B, offset, 1, l.Out)}, nil
}

// Unfold reverses Fold: given the folded layer (W', b') and the original affine, it returns W = W' diag(1/g) and
// b = b' - W beta. It fails if some g is zero (that input channel was erased by the norm and cannot be
// recovered). The result has a bias whenever the folded layer has one; if the original layer had none, its
// recovered bias is zero up to rounding and the caller may drop it.
func Unfold(n NormAffine, l Dense) (Dense, error) {
	if err := check(n, l); err != nil {
		return Dense{}, err
	}
	w, offset, err := n.InputToOriginal(l.W, l.Out)
	if err != nil {
		return Dense{}, err
	}
	out := Dense{Out: l.Out, In: l.In, W: w}
	if l.B != nil {
		out.B = AddOffset(l.B, offset, -1, l.Out)
	}
	return out, nil
}

// AddOffset returns b + sign·offset in float64 rounded to float32: b may be nil (zeros), and so may offset
// (b unchanged; nil when b is nil too). It is how a change of basis's offset lands in a bias.
func AddOffset(b []float32, offset []float64, sign float64, n int) []float32 {
	if offset == nil {
		if b == nil {
			return nil
		}
		return append([]float32(nil), b...)
	}
	out := make([]float32, n)
	for o := range out {
		s := sign * offset[o]
		if b != nil {
			s += float64(b[o])
		}
		out[o] = float32(s)
	}
	return out
}
