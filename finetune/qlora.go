package finetune

import (
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
var isNF4 = quant.IsNF4Tensor

// nf4Targets lists the weights QLoRA quantises: every linear layer's but the output head's.
func nf4Targets(layers []models.LinearLayer) []quant.LinearWeight {
	var out []quant.LinearWeight
	for _, l := range layers {
		if !l.Head {
			out = append(out, quant.LinearWeight{Name: l.Path + ".weight", Out: l.Out, In: l.In})
		}
	}
	return out
}

// nf4Hook returns the Bound.Weights hook that dequantises the model's NF4 weights in dtype.
var nf4Hook = runner.NF4Weights

// nf4Shapes replaces, in parameter shapes, every non-head linear weight by its NF4 tensors' shapes; with
// msNorm, the weights a norm folds into (folds' Linears) get the per-input-channel scale too, as models.ApplyFolds
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
	q, ok, err := quant.FromTensors(p, l.Path+".weight", l.Out, l.In)
	if !ok || err != nil {
		return nil, ok, err
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
