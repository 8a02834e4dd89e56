package models

import (
	"fmt"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/msnorm"
	"github.com/memfit/memfit/quant"
)

// Linear names a linear layer's weight ([out, in]) and bias ([out], may be absent) parameters.
type Linear struct{ Weight, Bias string }

// Fold names a norm whose affine (Gamma, and Beta when the model has it) moves into the linear layers that
// consume the norm's output, for MS-LN / MS-RMSNorm. PlusOne marks Gemma-style norms that scale by 1 + gamma.
//
// Shared marks a norm whose output is also the residual stream (a post-LN encoder, models/bert): the linear
// layers take the folded affine and read the norm's output without it, while the residual stream still needs
// the affine, so the norm keeps its tensors (they stay among the model's parameters and train under full
// fine-tuning). Unfolding then reads the norm's tensors as they are in the parameters being unfolded (trained
// ones included), falling back to their values at folding time.
type Fold struct {
	Gamma, Beta string
	PlusOne     bool
	Shared      bool
	Linears     []Linear
}

// ApplyFolds returns a copy of p in which each fold's affine is folded into its linear layers with msnorm.Fold
// (W' = W diag(gamma), b' = b + W beta; a bias appears where beta is not zero) and the norm's own tensors are
// removed (a Shared fold's stay); removed holds every fold's norm tensors as they were folded, which export needs
// to undo the folding. p is not modified.
//
// It is the one place a model's norms are folded, float or quantised: a weight stored in NF4 (quantised before
// folding, QLoRA) takes gamma exactly as its per-input-channel scale (quant.NF4.Fold: codes and block scales
// untouched) and beta through its dequantised value (b' = b + W_nf4 beta); arch (the architecture's parameter
// shapes, may be nil without NF4 weights) gives the quantised weights' shapes.
func ApplyFolds(p Params, folds []Fold, arch map[string][]int) (folded, removed Params, err error) {
	folded = Params{}
	for name, t := range p {
		folded[name] = t
	}
	removed = Params{}
	for _, f := range folds {
		norm, err := normAffine(p, f)
		if err != nil {
			return nil, nil, err
		}
		for _, l := range f.Linears {
			var b []float32
			if l.Bias != "" {
				if _, ok := p[l.Bias]; ok {
					if b, err = p.Float32s(l.Bias); err != nil {
						return nil, nil, err
					}
				}
			}
			q, quantised, err := nf4Weight(p, l.Weight, arch)
			if err != nil {
				return nil, nil, err
			}
			var w []float32
			var dims []int
			if quantised {
				w, dims = q.Dequantize(), []int{q.Out, q.In}
			} else {
				if w, err = p.Float32s(l.Weight); err != nil {
					return nil, nil, err
				}
				if dims = p.Dims(l.Weight); len(dims) != 2 {
					return nil, nil, fmt.Errorf("%s has shape %v, want [out, in]", l.Weight, dims)
				}
			}
			out, err := msnorm.Fold(norm, msnorm.Dense{Out: dims[0], In: dims[1], W: w, B: b})
			if err != nil {
				return nil, nil, fmt.Errorf("folding %s into %s: %w", f.Gamma, l.Weight, err)
			}
			if quantised {
				scale := make([]float32, q.In)
				for i := range scale {
					scale[i] = float32(norm.Scale(i))
				}
				if err := q.Fold(scale); err != nil {
					return nil, nil, fmt.Errorf("folding %s into %s: %w", f.Gamma, l.Weight, err)
				}
				for n, t := range q.Tensors(l.Weight) {
					folded[n] = t
				}
			} else {
				folded[l.Weight] = tensors.FromFlatDataAndDimensions(out.W, dims...)
			}
			if out.B != nil {
				if l.Bias == "" {
					return nil, nil, fmt.Errorf("folding %s into %s needs a bias, and the layer has no bias name", f.Beta, l.Weight)
				}
				folded[l.Bias] = tensors.FromFlatDataAndDimensions(out.B, dims[0])
			}
		}
		for _, n := range []string{f.Gamma, f.Beta} {
			if t, ok := p[n]; ok && n != "" {
				removed[n] = t
				if !f.Shared {
					delete(folded, n)
				}
			}
		}
	}
	return folded, removed, nil
}

// normAffine reads fold f's norm affine from p.
func normAffine(p Params, f Fold) (msnorm.NormAffine, error) {
	gamma, err := p.Float32s(f.Gamma)
	if err != nil {
		return msnorm.NormAffine{}, err
	}
	norm := msnorm.NormAffine{Gamma: gamma, PlusOne: f.PlusOne}
	if f.Beta != "" {
		if _, ok := p[f.Beta]; ok {
			if norm.Beta, err = p.Float32s(f.Beta); err != nil {
				return msnorm.NormAffine{}, err
			}
		}
	}
	return norm, nil
}

// nf4Weight reads the NF4 weight stored under name, when there is one; arch gives its [out, in].
func nf4Weight(p Params, name string, arch map[string][]int) (*quant.NF4, bool, error) {
	if _, ok := p[name+quant.SuffixCodes]; !ok {
		return nil, false, nil
	}
	dims := arch[name]
	if len(dims) != 2 {
		return nil, true, fmt.Errorf("%s is stored in NF4 but its shape is not known (architecture shape %v)", name, dims)
	}
	return quant.FromTensors(p, name, dims[0], dims[1])
}

// NormOf returns the norm affine that folds put into the linear layer with weight name, reading the norm's
// tensors from removed (what ApplyFolds removed); ok is false when no fold feeds that layer or nothing was folded.
func NormOf(folds []Fold, removed Params, weight string) (norm msnorm.NormAffine, ok bool, err error) {
	if len(removed) == 0 {
		return msnorm.NormAffine{}, false, nil
	}
	for _, f := range folds {
		for _, l := range f.Linears {
			if l.Weight == weight {
				norm, err := normAffine(removed, f)
				return norm, err == nil, err
			}
		}
	}
	return msnorm.NormAffine{}, false, nil
}

// UndoFolds is the inverse of ApplyFolds for export: it returns a copy of p in which every linear layer that
// folds fed (removed holding the norms' tensors) is unfolded with msnorm.Unfold. With partial, layers absent
// from p are skipped (p holds some trained tensors only); otherwise they are an error. The norm tensors
// themselves are not added, and p is not modified. A Shared fold unfolds with its norm's tensors from p when p
// has them (the affine the residual stream used, trained or not), else with removed's.
func UndoFolds(p Params, folds []Fold, removed Params, partial bool) (Params, error) {
	out := Params{}
	for n, v := range p {
		out[n] = v
	}
	if len(removed) == 0 {
		return out, nil
	}
	for _, f := range folds {
		src := removed
		if _, ok := p[f.Gamma]; ok && f.Shared {
			src = p
		}
		norm, err := normAffine(src, f)
		if err != nil {
			return nil, err
		}
		for _, l := range f.Linears {
			if _, ok := p[l.Weight]; !ok {
				if partial {
					continue
				}
				return nil, fmt.Errorf("missing %s to unfold", l.Weight)
			}
			w, err := p.Float32s(l.Weight)
			if err != nil {
				return nil, err
			}
			dims := p.Dims(l.Weight)
			if len(dims) != 2 {
				return nil, fmt.Errorf("%s has shape %v, want [out, in]", l.Weight, dims)
			}
			d := msnorm.Dense{Out: dims[0], In: dims[1], W: w}
			if _, ok := p[l.Bias]; ok && l.Bias != "" {
				if d.B, err = p.Float32s(l.Bias); err != nil {
					return nil, err
				}
			}
			if d, err = msnorm.Unfold(norm, d); err != nil {
				return nil, fmt.Errorf("%s: %w", l.Weight, err)
			}
			out[l.Weight] = tensors.FromFlatDataAndDimensions(d.W, dims...)
			if d.B != nil {
				out[l.Bias] = tensors.FromFlatDataAndDimensions(d.B, dims[0])
			}
		}
	}
	return out, nil
}

// FoldedShapes returns the parameter shapes that ApplyFolds produces from parameters with the given shapes: the
// folded norms' tensors are gone, and a linear layer fed by a norm with a beta gains a bias [out] where it had
// none (ApplyFolds adds it when beta is not all zero; shapes alone cannot tell, so this assumes it is not). A
// Shared fold's norm keeps its tensors.
func FoldedShapes(shapes map[string][]int, folds []Fold) map[string][]int {
	out := make(map[string][]int, len(shapes))
	for n, d := range shapes {
		out[n] = d
	}
	for _, f := range folds {
		_, hasBeta := shapes[f.Beta]
		for _, l := range f.Linears {
			if _, ok := out[l.Bias]; hasBeta && l.Bias != "" && !ok {
				if w, ok := shapes[l.Weight]; ok && len(w) == 2 {
					out[l.Bias] = []int{w[0]}
				}
			}
		}
		if f.Shared {
			continue
		}
		delete(out, f.Gamma)
		if f.Beta != "" {
			delete(out, f.Beta)
		}
	}
	return out
}
