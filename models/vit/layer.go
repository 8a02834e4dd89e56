package vit

import (
	"math/rand/v2"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/models"
)

// Hugging Face module paths of one encoder layer's linear layers, relative to "vit.encoder.layer.{i}." (their
// parameters are <path>.weight and <path>.bias).
const (
	Query = "attention.attention.query"
	Key   = "attention.attention.key"
	Value = "attention.attention.value"
	Out   = "attention.output.dense"
	Up    = "intermediate.dense"
	Down  = "output.dense"
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
type LayerParams = models.Params

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

// layerFolds are the MS-LN folds of one layer whose parameter names start with prefix: layernorm_before into
// query, key and value, layernorm_after into intermediate.dense.
func layerFolds(prefix string) []models.Fold {
	lin := func(w, b string) models.Linear { return models.Linear{Weight: prefix + w, Bias: prefix + b} }
	return []models.Fold{
		{Gamma: prefix + NormBeforeWeight, Beta: prefix + NormBeforeBias,
			Linears: []models.Linear{lin(QueryWeight, QueryBias), lin(KeyWeight, KeyBias), lin(ValueWeight, ValueBias)}},
		{Gamma: prefix + NormAfterWeight, Beta: prefix + NormAfterBias, Linears: []models.Linear{lin(UpWeight, UpBias)}},
	}
}

// FoldLayer returns a copy of p for MS-LN: layernorm_before is folded into query, key and value, layernorm_after
// into intermediate.dense, and the four norm tensors are dropped. p is not modified.
func FoldLayer(p LayerParams) (LayerParams, error) {
	folded, _, err := models.ApplyFolds(p, layerFolds(""), nil)
	return folded, err
}
