package vit

import (
	"fmt"
	"math/rand/v2"
	"sort"

	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/memfit/memfit/msnorm"
)

// Hugging Face parameter names of one encoder layer, relative to "vit.encoder.layer.{i}.".
const (
	NormBeforeWeight = "layernorm_before.weight"
	NormBeforeBias   = "layernorm_before.bias"
	QueryWeight      = "attention.attention.query.weight"
	QueryBias        = "attention.attention.query.bias"
	KeyWeight        = "attention.attention.key.weight"
	KeyBias          = "attention.attention.key.bias"
	ValueWeight      = "attention.attention.value.weight"
	ValueBias        = "attention.attention.value.bias"
	OutWeight        = "attention.output.dense.weight"
	OutBias          = "attention.output.dense.bias"
	NormAfterWeight  = "layernorm_after.weight"
	NormAfterBias    = "layernorm_after.bias"
	UpWeight         = "intermediate.dense.weight"
	UpBias           = "intermediate.dense.bias"
	DownWeight       = "output.dense.weight"
	DownBias         = "output.dense.bias"
)

// LayerParams holds one encoder layer's tensors by Hugging Face name (relative to the layer prefix).
type LayerParams map[string]*tensors.Tensor

// Names returns the parameter names in a stable order.
func (p LayerParams) Names() []string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// RandomLayer returns a layer with hidden size hidden and MLP size mlp, initialised like a pretrained ViT-B
// (normal(0, 0.02) linear weights, small biases, LayerNorm weights near 1), from seed.
func RandomLayer(seed uint64, hidden, mlp int) LayerParams {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	normal := func(n int, mean, std float64) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(mean + std*r.NormFloat64())
		}
		return out
	}
	t := func(data []float32, dims ...int) *tensors.Tensor {
		return tensors.FromFlatDataAndDimensions(data, dims...)
	}
	return LayerParams{
		NormBeforeWeight: t(normal(hidden, 1, 0.1), hidden),
		NormBeforeBias:   t(normal(hidden, 0, 0.05), hidden),
		QueryWeight:      t(normal(hidden*hidden, 0, 0.02), hidden, hidden),
		QueryBias:        t(normal(hidden, 0, 0.02), hidden),
		KeyWeight:        t(normal(hidden*hidden, 0, 0.02), hidden, hidden),
		KeyBias:          t(normal(hidden, 0, 0.02), hidden),
		ValueWeight:      t(normal(hidden*hidden, 0, 0.02), hidden, hidden),
		ValueBias:        t(normal(hidden, 0, 0.02), hidden),
		OutWeight:        t(normal(hidden*hidden, 0, 0.02), hidden, hidden),
		OutBias:          t(normal(hidden, 0, 0.02), hidden),
		NormAfterWeight:  t(normal(hidden, 1, 0.1), hidden),
		NormAfterBias:    t(normal(hidden, 0, 0.05), hidden),
		UpWeight:         t(normal(mlp*hidden, 0, 0.02), mlp, hidden),
		UpBias:           t(normal(mlp, 0, 0.02), mlp),
		DownWeight:       t(normal(hidden*mlp, 0, 0.02), hidden, mlp),
		DownBias:         t(normal(hidden, 0, 0.02), hidden),
	}
}

// FoldLayer returns a copy of p for MS-LN: layernorm_before is folded into query, key and value, layernorm_after
// into intermediate.dense, and the four norm tensors are dropped. p is not modified.
func FoldLayer(p LayerParams) (LayerParams, error) {
	out := LayerParams{}
	for name, t := range p {
		out[name] = t
	}
	for _, fold := range []struct {
		gamma, beta string
		linears     [][2]string
	}{
		{NormBeforeWeight, NormBeforeBias, [][2]string{{QueryWeight, QueryBias}, {KeyWeight, KeyBias}, {ValueWeight, ValueBias}}},
		{NormAfterWeight, NormAfterBias, [][2]string{{UpWeight, UpBias}}},
	} {
		gamma, err := floats(p, fold.gamma)
		if err != nil {
			return nil, err
		}
		var beta []float32
		if _, ok := p[fold.beta]; ok {
			if beta, err = floats(p, fold.beta); err != nil {
				return nil, err
			}
		}
		for _, l := range fold.linears {
			w, err := floats(p, l[0])
			if err != nil {
				return nil, err
			}
			dims := p[l[0]].Shape().Dimensions
			if len(dims) != 2 {
				return nil, fmt.Errorf("vit: %s has shape %v, want [out, in]", l[0], dims)
			}
			var b []float32
			if _, ok := p[l[1]]; ok {
				if b, err = floats(p, l[1]); err != nil {
					return nil, err
				}
			}
			folded, err := msnorm.Fold(msnorm.NormAffine{Gamma: gamma, Beta: beta}, msnorm.Dense{Out: dims[0], In: dims[1], W: w, B: b})
			if err != nil {
				return nil, fmt.Errorf("vit: folding %s into %s: %w", fold.gamma, l[0], err)
			}
			out[l[0]] = tensors.FromFlatDataAndDimensions(folded.W, dims...)
			if folded.B != nil {
				out[l[1]] = tensors.FromFlatDataAndDimensions(folded.B, dims[0])
			}
		}
		delete(out, fold.gamma)
		delete(out, fold.beta)
	}
	return out, nil
}

func floats(p LayerParams, name string) ([]float32, error) {
	t, ok := p[name]
	if !ok {
		return nil, fmt.Errorf("vit: missing parameter %q", name)
	}
	var out []float32
	err := tensors.ConstFlatData[float32](t, func(flat []float32) { out = append([]float32(nil), flat...) })
	if err != nil {
		return nil, fmt.Errorf("vit: parameter %q: %w", name, err)
	}
	return out, nil
}

// BindLayer returns the BlockWeights whose nodes are nodes[name] (absent names stay nil).
func BindLayer(nodes map[string]*graph.Node) BlockWeights {
	return BlockWeights{
		NormBefore: nodes[NormBeforeWeight], NormBeforeBias: nodes[NormBeforeBias],
		Query: nodes[QueryWeight], QueryBias: nodes[QueryBias],
		Key: nodes[KeyWeight], KeyBias: nodes[KeyBias],
		Value: nodes[ValueWeight], ValueBias: nodes[ValueBias],
		Out: nodes[OutWeight], OutBias: nodes[OutBias],
		NormAfter: nodes[NormAfterWeight], NormAfterBias: nodes[NormAfterBias],
		Up: nodes[UpWeight], UpBias: nodes[UpBias],
		Down: nodes[DownWeight], DownBias: nodes[DownBias],
	}
}
