package finetune

import (
	"fmt"
	"math/rand/v2"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/quant"
)

// Shape is the input shape of a step: the batch size and, for LLaMA, the sequence length (ViT uses the model's
// image size). The memory planner (package plan) plans steps at a Shape; RandomBatch makes batches of one.
type Shape struct {
	Batch int `json:"batch"`
	Seq   int `json:"seq,omitempty"`
}

// RandomBatch makes one batch of random inputs of the given shape for model (calibration and benchmarks:
// step times do not depend on the values).
func RandomBatch(model Model, shape Shape, seed uint64) Batch {
	r := rand.New(rand.NewPCG(seed, 7))
	switch m := model.(type) {
	case ViT:
		c := m.Config
		px := make([]float32, shape.Batch*c.NumChannels*c.ImageSize*c.ImageSize)
		for i := range px {
			px[i] = float32(r.NormFloat64())
		}
		labels := make([]int32, shape.Batch)
		for i := range labels {
			labels[i] = int32(r.IntN(max(1, len(c.Labels))))
		}
		return Batch{"pixel_values": tensors.FromFlatDataAndDimensions(px, shape.Batch, c.NumChannels, c.ImageSize, c.ImageSize),
			"labels": tensors.FromFlatDataAndDimensions(labels, shape.Batch)}
	case Llama:
		n := shape.Batch * shape.Seq
		ids := make([]int32, n)
		mask := make([]int32, n)
		for i := range ids {
			ids[i], mask[i] = int32(r.IntN(m.Config.VocabSize)), 1
		}
		return Batch{"input_ids": tensors.FromFlatDataAndDimensions(ids, shape.Batch, shape.Seq),
			"attention_mask": tensors.FromFlatDataAndDimensions(mask, shape.Batch, shape.Seq),
			"labels":         tensors.FromFlatDataAndDimensions(append([]int32(nil), ids...), shape.Batch, shape.Seq)}
	}
	return nil
}

// WithRandomWeights returns model (made from its config alone, without weights: plan.ShapeModel) with random
// weights in cfg's form (quantised for QLoRA, folded with MS-norm), as LoadModel would load them: for timing
// steps at a model's shape.
func WithRandomWeights(model Model, cfg Config, seed uint64) (Model, error) {
	var out rebuilder
	switch m := model.(type) {
	case ViT:
		opts := m.Options
		opts.MSNorm = false
		v, err := vit.New(m.Config, vit.RandomParams(m.Config, seed), opts)
		if err != nil {
			return nil, err
		}
		out = ViT{Model: v}
	case Llama:
		opts := m.Options
		opts.MSNorm = false
		l, err := llama.New(m.Config, llama.RandomParams(m.Config, seed), opts)
		if err != nil {
			return nil, err
		}
		out = Llama{Model: l}
	default:
		return nil, fmt.Errorf("model %T", model)
	}
	params := out.Params()
	if cfg.Method == MethodQLoRA {
		q, err := quant.QuantizeWeights(params, nf4Targets(out.LinearLayers()))
		if err != nil {
			return nil, err
		}
		params = q
	}
	return out.rebuild(params, cfg.MSNorm)
}
