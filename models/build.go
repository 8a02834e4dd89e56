package models

import (
	"fmt"
	"math/rand/v2"
	"sort"

	"github.com/gomlx/gomlx/core/tensors"
)

// Architecture is what building a model from its weights needs to know of its config: its parameters' shapes
// (by Hugging Face name), its MS-norm folds and its number of transformer blocks (what a per-block plan covers).
type Architecture struct {
	Shapes map[string][]int
	Folds  []Fold
	Blocks int
}

// Prepare is the part of building a model that every model package shares: params checked against arch's
// shapes (every name present with its shape, nothing else, float32), the per-block plan (nil: none) against its
// blocks, and the norms folded into the linear layers they feed when msNorm. It returns the graph's parameters
// and the original tensors of the folded norms (empty without msNorm), for export.
func Prepare(arch Architecture, params Params, plan []BlockMode, msNorm bool) (graphParams, folded Params, err error) {
	if err := CheckShapes(params, arch.Shapes); err != nil {
		return nil, nil, err
	}
	if plan != nil && len(plan) != arch.Blocks {
		return nil, nil, fmt.Errorf("the per-block memory plan has %d blocks, the model %d", len(plan), arch.Blocks)
	}
	if !msNorm {
		return params, Params{}, nil
	}
	return ApplyFolds(params, arch.Folds, arch.Shapes)
}

// Init says how RandomParams draws one parameter: every value Const, or normal(0, Std) (redrawn outside
// ±Truncate standard deviations when Truncate > 0) when Std > 0.
type Init struct {
	Const         float32
	Std, Truncate float64
}

// RandomParams draws a parameter of every name in shapes as init says, from one random stream (seed, stream)
// taken in sorted name order: the same seed gives the same weights.
func RandomParams(shapes map[string][]int, seed, stream uint64, init func(name string, dims []int) Init) Params {
	r := rand.New(rand.NewPCG(seed, stream))
	names := make([]string, 0, len(shapes))
	for name := range shapes {
		names = append(names, name)
	}
	sort.Strings(names)
	p := Params{}
	for _, name := range names {
		dims := shapes[name]
		n := 1
		for _, d := range dims {
			n *= d
		}
		data := make([]float32, n)
		in := init(name, dims)
		for i := range data {
			if in.Std <= 0 {
				data[i] = in.Const
				continue
			}
			v := r.NormFloat64()
			for in.Truncate > 0 && (v > in.Truncate || v < -in.Truncate) {
				v = r.NormFloat64()
			}
			data[i] = float32(in.Std * v)
		}
		p[name] = tensors.FromFlatDataAndDimensions(data, dims...)
	}
	return p
}
