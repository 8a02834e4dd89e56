package finetune

import (
	"fmt"

	"github.com/memfit/memfit/quant"
)

// Shape is the input shape of a step: the batch size and, for a family with a sequence (LLaMA), the sequence
// length (a ViT's is its image size). The memory planner (package plan) plans steps at a Shape; RandomBatch makes
// batches of one.
type Shape struct {
	Batch int `json:"batch"`
	Seq   int `json:"seq,omitempty"`
	// Packed says the sequences are packed examples (--packing): a LLaMA batch then has position_ids too, and
	// its attention mask is per row ([B, 1, T, T] instead of causal [T, T] and padding [B, T]).
	Packed bool `json:"packed,omitempty"`
}

// RandomBatch makes one batch of random inputs of the given shape for model (calibration and benchmarks:
// step times do not depend on the values); nil for a model whose family makes none.
func RandomBatch(model Model, shape Shape, seed uint64) Batch {
	fam, ok := FamilyOf(model)
	if !ok || fam.RandomBatch == nil {
		return nil
	}
	return fam.RandomBatch(model, shape, seed)
}

// WithRandomWeights returns model (made from its config alone, without weights: plan.ShapeModel) with random
// weights in cfg's form (quantised for QLoRA, folded with MS-norm), as LoadModel would load them: for timing
// steps at a model's shape.
func WithRandomWeights(model Model, cfg Config, seed uint64) (Model, error) {
	fam, ok := FamilyOf(model)
	if !ok || fam.RandomParams == nil {
		return nil, fmt.Errorf("model %T", model)
	}
	out, err := fam.Rebuild(model, fam.RandomParams(model, seed), false)
	if err != nil {
		return nil, err
	}
	params := out.Params()
	if cfg.Method == MethodQLoRA {
		q, err := quant.QuantizeWeights(params, nf4Targets(out.LinearLayers()))
		if err != nil {
			return nil, err
		}
		params = q
	}
	return fam.Rebuild(out, params, cfg.MSNorm)
}
