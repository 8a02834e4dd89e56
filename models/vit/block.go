// Package vit builds Vision Transformer (ViT) graphs in the Hugging Face layout, in any combination of the
// memory-saving options: approximate activation backward (ReGELU2) and memory-sharing LayerNorm (MS-LN).
package vit

import (
	"fmt"

	"github.com/gomlx/gomlx/pkg/core/graph"

	"github.com/memfit/memfit/approxbp"
	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/msnorm"
)

// BlockWeights are the graph nodes of one ViT encoder layer, named after the Hugging Face parameters
// (vit.encoder.layer.{i}.*). Linear weights are [out, in]. With BlockOptions.MSNorm the norm weights and biases
// must be nil: they are folded into Query/Key/Value (layernorm_before) and Up (layernorm_after) beforehand with
// msnorm.Fold, and those layers then carry the folded biases.
type BlockWeights struct {
	NormBefore, NormBeforeBias *graph.Node // layernorm_before.{weight,bias}
	Query, QueryBias           *graph.Node // attention.attention.query
	Key, KeyBias               *graph.Node // attention.attention.key
	Value, ValueBias           *graph.Node // attention.attention.value
	Out, OutBias               *graph.Node // attention.output.dense
	NormAfter, NormAfterBias   *graph.Node // layernorm_after.{weight,bias}
	Up, UpBias                 *graph.Node // intermediate.dense
	Down, DownBias             *graph.Node // output.dense
}

// BlockOptions choose the block's shape and memory-saving modes.
type BlockOptions struct {
	Heads int     // attention heads
	Eps   float64 // LayerNorm epsilon (HF layer_norm_eps, 1e-12 for google/vit-*)
	// ApproxActivation uses ReGELU2 (exact GELU forward, 2-bit backward) instead of GELU.
	ApproxActivation bool
	// MSNorm uses MS-LN (no affine; the affine is folded into the next linear layers).
	MSNorm bool
	// Attention chooses standard attention (keeps the probabilities) or the memory-efficient kind.
	Attention attention.Kind
}

// Block applies one pre-LN ViT encoder layer to x [B, N, D]:
//
//	h = x + Out(Attention(Q(LN1(x)), K(LN1(x)), V(LN1(x))))
//	y = h + Down(GELU(Up(LN2(h))))
func Block(x *graph.Node, w BlockWeights, opt BlockOptions) *graph.Node {
	if opt.MSNorm && (w.NormBefore != nil || w.NormAfter != nil || w.NormBeforeBias != nil || w.NormAfterBias != nil) {
		panic("vit.Block: with MSNorm the norm weights must be folded into the next linear layers and passed as nil")
	}
	if !opt.MSNorm && (w.NormBefore == nil || w.NormAfter == nil) {
		panic("vit.Block: LayerNorm weights are missing")
	}
	if opt.Heads <= 0 {
		panic(fmt.Sprintf("vit.Block: heads must be positive, got %d", opt.Heads))
	}
	norm := func(x, gamma, beta *graph.Node) *graph.Node {
		if opt.MSNorm {
			return msnorm.MSLayerNorm(x, opt.Eps)
		}
		return msnorm.LayerNorm(x, gamma, beta, opt.Eps)
	}
	act := approxbp.GELU
	if opt.ApproxActivation {
		act = approxbp.ReGELU2
	}

	n1 := norm(x, w.NormBefore, w.NormBeforeBias)
	q := engine.Linear(n1, w.Query, w.QueryBias)
	k := engine.Linear(n1, w.Key, w.KeyBias)
	v := engine.Linear(n1, w.Value, w.ValueBias)
	ctx := attention.Attention(opt.Attention, q, k, v, opt.Heads, opt.Heads, attention.Mask{})
	h := graph.Add(x, engine.Linear(ctx, w.Out, w.OutBias))

	n2 := norm(h, w.NormAfter, w.NormAfterBias)
	m := act(engine.Linear(n2, w.Up, w.UpBias))
	return graph.Add(h, engine.Linear(m, w.Down, w.DownBias))
}
