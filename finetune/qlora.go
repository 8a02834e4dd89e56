package finetune

import (
	"fmt"
	"strings"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
	"github.com/memfit/memfit/quant"
	"github.com/memfit/memfit/runner"
)

// MethodQLoRA trains LoRA adapters over a base whose linear layers (all but the output head) are stored in NF4
// with double-quantised scales and dequantised inside the step (forward and, again, backward).
const MethodQLoRA = "qlora"

// isNF4 reports whether a parameter name is part of an NF4 weight.
func isNF4(name string) bool { return strings.Contains(name, ".weight.nf4_") }

// quantizeModel replaces every non-head linear weight of model (loaded without MS-norm folding) by its NF4 form
// (double-quantised scales). With msNorm, it then folds each norm into the layers it feeds, as loading with
// MSNorm would: into NF4 weights exactly, gamma as a per-input-channel scale (quant.NF4.Fold) and beta as
// bias + W_nf4 beta (W_nf4 the dequantised weight, ViT's LayerNorm); into the float32 head as usual. The norm
// tensors move to the model's Folded set and the model builds MS-norms.
func quantizeModel(model Model, msNorm bool) error {
	params := model.Params()
	quantized := map[string]*quant.NF4{}
	for _, l := range model.LinearLayers() {
		if l.Head {
			continue
		}
		name := l.Path + ".weight"
		w, err := params.Float32s(name)
		if err != nil {
			return err
		}
		q, err := quant.QuantizeNF4(w, l.Out, l.In, true)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		quantized[name] = q
	}
	removed := models.Params{}
	if msNorm {
		for _, f := range model.Folds() {
			gamma, err := params.Float32s(f.Gamma)
			if err != nil {
				return err
			}
			var beta []float32
			if _, ok := params[f.Beta]; ok && f.Beta != "" {
				if beta, err = params.Float32s(f.Beta); err != nil {
					return err
				}
			}
			var rest []models.Linear
			for _, l := range f.Linears {
				q, ok := quantized[l.Weight]
				if !ok {
					rest = append(rest, l)
					continue
				}
				if beta != nil {
					if l.Bias == "" {
						return fmt.Errorf("folding %s into %s needs a bias", f.Beta, l.Weight)
					}
					wq := q.Dequantize()
					bias := make([]float32, q.Out)
					if _, ok := params[l.Bias]; ok {
						if bias, err = params.Float32s(l.Bias); err != nil {
							return err
						}
					}
					for o := 0; o < q.Out; o++ {
						acc := float64(bias[o])
						for j := 0; j < q.In; j++ {
							acc += float64(wq[o*q.In+j]) * float64(beta[j])
						}
						bias[o] = float32(acc)
					}
					params[l.Bias] = tensors.FromFlatDataAndDimensions(bias, q.Out)
				}
				if err := q.Fold(effectiveGamma(gamma, f.PlusOne)); err != nil {
					return err
				}
			}
			if len(rest) > 0 {
				sub := f
				sub.Linears = rest
				out, _, err := models.ApplyFolds(params, []models.Fold{sub})
				if err != nil {
					return err
				}
				for _, l := range rest {
					params[l.Weight] = out[l.Weight]
					if t, ok := out[l.Bias]; ok && l.Bias != "" {
						params[l.Bias] = t
					}
				}
			}
			for _, n := range []string{f.Gamma, f.Beta} {
				if t, ok := params[n]; ok && n != "" {
					removed[n] = t
					delete(params, n)
				}
			}
		}
	}
	for name, q := range quantized {
		delete(params, name)
		for n, t := range q.Tensors(name) {
			params[n] = t
		}
	}
	switch m := model.(type) {
	case ViT:
		m.Model.Folded, m.Model.Options.MSNorm = removed, msNorm
	case Llama:
		m.Model.Folded, m.Model.Options.MSNorm = removed, msNorm
	default:
		return fmt.Errorf("QLoRA does not know model %T", model)
	}
	return nil
}

func effectiveGamma(gamma []float32, plusOne bool) []float32 {
	if !plusOne {
		return gamma
	}
	g := make([]float32, len(gamma))
	for i, v := range gamma {
		g[i] = 1 + v
	}
	return g
}

// nf4Hook returns the Bound.Weights hook that dequantises the model's NF4 weights in dtype.
var nf4Hook = runner.NF4Weights

// nf4Shapes replaces, in parameter shapes, every non-head linear weight by its NF4 tensors' shapes; with
// msNorm, the weights a norm folds into (folds' Linears) get the per-input-channel scale too, as quantizeModel
// writes them.
func nf4Shapes(params map[string]shapes.Shape, layers []models.LinearLayer, folds []models.Fold, msNorm bool) {
	scaled := map[string]bool{}
	if msNorm {
		for _, f := range folds {
			for _, l := range f.Linears {
				scaled[l.Weight] = true
			}
		}
	}
	for _, l := range layers {
		if l.Head {
			continue
		}
		name := l.Path + ".weight"
		if _, ok := params[name]; !ok {
			continue
		}
		delete(params, name)
		for suffix, s := range quant.Shapes(l.Out, l.In, true, scaled[name]) {
			params[name+suffix] = s
		}
	}
}

// dequantizeAll returns p with every NF4 weight replaced by its dequantised float32 weight (folded norms'
// gamma included, as the graph computes it).
func dequantizeAll(p models.Params, layers []models.LinearLayer) (models.Params, error) {
	out := models.Params{}
	for n, v := range p {
		if !isNF4(n) {
			out[n] = v
		}
	}
	for _, l := range layers {
		w, ok, err := dequantize(p, l)
		if err != nil {
			return nil, err
		}
		if ok {
			out[l.Path+".weight"] = tensors.FromFlatDataAndDimensions(w, l.Out, l.In)
		}
	}
	return out, nil
}

// dequantize returns the float32 weight [Out, In] of layer l when p holds it in NF4 (ok false otherwise).
func dequantize(p models.Params, l models.LinearLayer) (w []float32, ok bool, err error) {
	prefix := l.Path + ".weight"
	codes, ok := p[prefix+quant.SuffixCodes]
	if !ok {
		return nil, false, nil
	}
	q := &quant.NF4{Out: l.Out, In: l.In}
	get := func(suffix string) []float32 {
		if _, ok := p[prefix+suffix]; !ok || err != nil {
			return nil
		}
		var v []float32
		v, err = p.Float32s(prefix + suffix)
		return v
	}
	codes.MustConstFlatData(func(f any) { q.Codes = append([]uint8(nil), f.([]uint8)...) })
	q.Absmax, q.Absmax2, q.ColScale = get(quant.SuffixAbsmax), get(quant.SuffixAbsmax2), get(quant.SuffixColScale)
	if off := get(quant.SuffixOffset); off != nil {
		q.Offset = off[0]
	}
	if t, ok := p[prefix+quant.SuffixAbsmaxQ]; ok {
		t.MustConstFlatData(func(f any) { q.AbsmaxQ = append([]uint8(nil), f.([]uint8)...) })
	}
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", prefix, err)
	}
	return q.Dequantize(), true, nil
}

// BaseWeights gives adapter.NewSet the frozen layers of model as the step computes them: float weights as they
// are, NF4 weights dequantised, both in the MS-norm-folded basis when the model was loaded with it. Use it to
// build a custom adapter set for finetune.New (WithAdapters).
func BaseWeights(model Model) func(models.LinearLayer) adapter.Base {
	return func(l models.LinearLayer) adapter.Base {
		return func() (msnorm.Dense, error) {
			p := model.Params()
			names := models.Linear{Weight: l.Path + ".weight", Bias: l.Path + ".bias"}
			w, ok, err := dequantize(p, l)
			if err != nil {
				return msnorm.Dense{}, err
			}
			if !ok {
				return denseOf(p, names, l.Out, l.In)
			}
			d := msnorm.Dense{Out: l.Out, In: l.In, W: w}
			if _, has := p[names.Bias]; has {
				if d.B, err = p.Float32s(names.Bias); err != nil {
					return msnorm.Dense{}, err
				}
			}
			return d, nil
		}
	}
}
