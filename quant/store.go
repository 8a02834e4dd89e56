package quant

import (
	"fmt"
	"strings"

	"github.com/gomlx/gomlx/core/tensors"
)

// IsNF4Tensor reports whether a parameter name is one of the tensors of an NF4 weight ("<path>.weight.nf4_...").
func IsNF4Tensor(name string) bool { return strings.Contains(name, ".weight.nf4_") }

// LinearWeight names a linear layer's weight [Out, In] to quantise.
type LinearWeight struct {
	Name    string
	Out, In int
}

// QuantizeWeights returns a copy of params in which each of weights is replaced by its NF4 tensors (double
// quantised, Tensors(name)); the other tensors are shared, params is not modified. It is the quantisation step
// of QLoRA's load -> quantise -> fold -> graph flow: folding (models.ApplyFolds) comes after and reads NF4
// weights with FromTensors.
func QuantizeWeights(params map[string]*tensors.Tensor, weights []LinearWeight) (map[string]*tensors.Tensor, error) {
	out := make(map[string]*tensors.Tensor, len(params))
	for n, t := range params {
		out[n] = t
	}
	for _, w := range weights {
		t, ok := params[w.Name]
		if !ok {
			return nil, fmt.Errorf("quant: no weight %q to quantise", w.Name)
		}
		var v []float32
		if err := tensors.ConstFlatData(t, func(f []float32) { v = f }); err != nil {
			return nil, fmt.Errorf("quant: %s: %w", w.Name, err)
		}
		q, err := QuantizeNF4(v, w.Out, w.In, true)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.Name, err)
		}
		delete(out, w.Name)
		for n, t := range q.Tensors(w.Name) {
			out[n] = t
		}
	}
	return out, nil
}

// FromTensors reads back the NF4 weight stored under prefix ("<path>.weight") by Tensors, for an [out, in]
// weight; ok is false when params holds no NF4 weight there.
func FromTensors(params map[string]*tensors.Tensor, prefix string, out, in int) (q *NF4, ok bool, err error) {
	codes, ok := params[prefix+SuffixCodes]
	if !ok {
		return nil, false, nil
	}
	n := out * in
	q = &NF4{Out: out, In: in}
	floats := func(suffix string) []float32 {
		t, has := params[prefix+suffix]
		if !has || err != nil {
			return nil
		}
		var v []float32
		if e := tensors.ConstFlatData(t, func(f []float32) { v = append(v, f...) }); e != nil {
			err = fmt.Errorf("quant: %s%s: %w", prefix, suffix, e)
		}
		return v
	}
	bytes := func(t *tensors.Tensor, suffix string) []uint8 {
		var v []uint8
		if e := tensors.ConstFlatData(t, func(f []uint8) { v = append(v, f...) }); e != nil && err == nil {
			err = fmt.Errorf("quant: %s%s: %w", prefix, suffix, e)
		}
		return v
	}
	q.Codes = bytes(codes, SuffixCodes)
	q.Absmax, q.Absmax2, q.ColScale = floats(SuffixAbsmax), floats(SuffixAbsmax2), floats(SuffixColScale)
	if off := floats(SuffixOffset); len(off) > 0 {
		q.Offset = off[0]
	}
	if t, has := params[prefix+SuffixAbsmaxQ]; has {
		q.AbsmaxQ = bytes(t, SuffixAbsmaxQ)
	}
	if err != nil {
		return nil, true, err
	}
	blocks := (n + BlockSize - 1) / BlockSize
	switch {
	case len(q.Codes) < (n+1)/2:
		err = fmt.Errorf("quant: %s holds %d codes, want %d for [%d, %d]", prefix+SuffixCodes, 2*len(q.Codes), n, out, in)
	case q.AbsmaxQ == nil && len(q.Absmax) < blocks, q.AbsmaxQ != nil && len(q.AbsmaxQ) < blocks:
		err = fmt.Errorf("quant: %s has fewer than %d block scales", prefix, blocks)
	case q.ColScale != nil && len(q.ColScale) != in:
		err = fmt.Errorf("quant: %s holds %d column scales, want %d", prefix+SuffixColScale, len(q.ColScale), in)
	}
	if err != nil {
		return nil, true, err
	}
	q.Codes = q.Codes[:(n+1)/2]
	if q.AbsmaxQ != nil {
		q.AbsmaxQ = q.AbsmaxQ[:blocks]
	}
	return q, true, nil
}
