// Package vit builds Vision Transformer (ViT) graphs in the Hugging Face layout, in any combination of the
// memory-saving options: approximate activation backward (ReGELU2) and memory-sharing LayerNorm (MS-LN).
package vit

import (
	"fmt"

	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/approxbp"
	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
	"github.com/memfit/memfit/quant"
)

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

// Block applies one pre-LN ViT encoder layer to x [B, N, D], with the parameters of b whose names start with
// prefix (see LayerPrefix; the names after it are the Hugging Face ones, QueryWeight etc.):
//
//	h = x + Out(Attention(Q(LN1(x)), K(LN1(x)), V(LN1(x))))
//	y = h + Down(GELU(Up(LN2(h))))
//
// With opt.MSNorm the layer's norm tensors must be absent: they were folded into query/key/value
// (layernorm_before) and intermediate.dense (layernorm_after) with msnorm.Fold, see FoldLayer. Linear layers go
// through b.ApplyLinear, so adapters see them by their module paths.
func Block(x *graph.Node, b models.Bound, prefix string, opt BlockOptions) *graph.Node {
	node := func(name string) *graph.Node { return b.Node(prefix + name) }
	hasNorms := node(NormBeforeWeight) != nil || node(NormAfterWeight) != nil || node(NormBeforeBias) != nil || node(NormAfterBias) != nil
	if opt.MSNorm && hasNorms {
		panic("vit.Block: with MSNorm the norm weights must be folded into the next linear layers, not passed")
	}
	if !opt.MSNorm && (node(NormBeforeWeight) == nil || node(NormAfterWeight) == nil) {
		panic("vit.Block: LayerNorm weights are missing")
	}
	if opt.Heads <= 0 {
		panic(fmt.Sprintf("vit.Block: heads must be positive, got %d", opt.Heads))
	}
	// Under Mesa (b.Keep), the norm output z and the linear inputs are kept as int8; with MS-LN z is both.
	norm := func(x *graph.Node, gamma, beta string) *graph.Node {
		z := b.Keep(quant.MesaNorm, msnorm.MSLayerNorm(x, opt.Eps), -1)
		if opt.MSNorm {
			return b.Keep(quant.MesaLinear, z, -1)
		}
		return b.Keep(quant.MesaLinear, msnorm.Affine(z, node(gamma), node(beta), false), -1)
	}
	lin := func(name string, x *graph.Node) *graph.Node { return b.ApplyLinear(prefix+name, x) }
	act := approxbp.GELU
	if opt.ApproxActivation {
		act = approxbp.ReGELU2
	}

	n1 := norm(x, NormBeforeWeight, NormBeforeBias)
	q := lin(Query, n1)
	k := lin(Key, n1)
	v := lin(Value, n1)
	ctx := attention.Attention(opt.Attention, q, k, v, opt.Heads, opt.Heads, attention.Mask{Keep: b.AttentionKeep()})
	h := graph.Add(x, lin(Out, b.Keep(quant.MesaLinear, ctx, -1)))

	n2 := norm(h, NormAfterWeight, NormAfterBias)
	m := b.Keep(quant.MesaLinear, act(b.Keep(quant.MesaActivation, lin(Up, n2), -1)), -1)
	return graph.Add(h, lin(Down, m))
}
