package encoder

import "github.com/memfit/memfit/models"

// MS-LN on a post-LN encoder.
//
// The Approx-BP paper's memory-sharing LayerNorm (its Proposition 5.1) rests on one identity: a LayerNorm
// y = g ∘ z + β (z = (x - mean x) / sqrt(var x + eps), the per-token normalisation) followed by a linear layer
// W y + b is the same map as W' z + b' with W' = W diag(g) and b' = b + W β (msnorm.Fold). Its conditions are that
// every consumer of y that keeps a tensor for the backward pass be a linear layer (so the affine can move into
// it), and that g have no zero (so the change of basis can be undone: export). Then the norm's backward, which
// reads z (and the per-token 1/std), and the linear layer's backward, which reads its input, read the same
// tensor z: one saved tensor instead of two.
//
// In a pre-LN block (ViT, LLaMA) y feeds linear layers only, and the residual stream is the norm's input, so the
// affine disappears from the graph. In a post-LN block (BERT, RoBERTa)
//
//	a = LN1(h + AttnOut(Attention(Q h, K h, V h)))      h: the previous layer's output (or the embeddings' LN)
//	h' = LN2(a + Output(GELU(Intermediate a)))
//
// each LayerNorm's output is both the next sublayer's input (linear layers: query/key/value, or intermediate)
// and the residual stream added after it. The linear consumers satisfy the conditions and fold exactly as above;
// the residual add does not consume y through a linear map, so the affine must still be computed for it:
// a = g ∘ z + β. That costs nothing in saved memory: an addition's backward keeps nothing, and the affine's own
// backward (dz = v ∘ g, and dg = Σ v ∘ z when g trains) reads only z, which the norm keeps anyway. So under MS-LN
// every LayerNorm of the encoder becomes
//
//	z = MSLayerNorm(s)                  kept once: the norm's backward, the folded linears' and the affine's
//	a = g ∘ z + β                       the residual stream only (not kept: the next add keeps nothing)
//	q = W'_q z + b'_q, ...              the folded consumers (W' = W diag(g), b' = b + W β)
//
// and the norm keeps its g and β (models.Fold's Shared): the forward is exact (the same real-valued map; float32
// rounding moves the logits by ~1e-6), and export unfolds W = W' diag(1/g), b = b' - W β with the g and β the
// residual stream used (trained ones under full fine-tuning). What is shared, per encoder layer, is the output
// LayerNorm's z (LN2, read by the next layer's query/key/value: with LoRA on query and key, their adapters keep
// their input, which is now z) and the attention LayerNorm's z (LN1, read by the intermediate dense: shared when
// that layer keeps its input, i.e. when it trains or carries an adapter). The embeddings' LayerNorm folds into
// layer 0's query/key/value the same way.
//
// The last layer's output LayerNorm feeds only the head (RoBERTa's classifier.dense or BERT's pooler on the first
// token, the masked LM's transform dense on every token): no residual stream follows, so it folds like a pre-LN
// norm (its g and β leave the model, and the last hidden state with the affine is no longer an output). The
// masked LM's own LayerNorm feeds the decoder tied to the word embeddings, which cannot take a per-channel scale
// without untying them: it stays a plain LayerNorm. The bare encoder (BertModel) keeps its last LayerNorm, whose
// output is the model's.
//
// Between blocks the stream is z, not a: block i receives z_{i-1} and rebuilds a_{i-1} = g_{i-1} ∘ z_{i-1} +
// β_{i-1} itself, so gradient checkpointing keeps one tensor per block (z) and the block reads the previous
// norm's g and β (models.Bound.ApplyBlockOver).

// Folds lists the MS-LN folds of cfg's model (see the derivation above): every LayerNorm into the linear layers
// that read it, shared with the residual stream except the last layer's into the head.
func Folds(cfg Config) []models.Fold {
	lin := func(path string) models.Linear { return models.Linear{Weight: path + ".weight", Bias: path + ".bias"} }
	qkv := func(i int) []models.Linear {
		pre := cfg.LayerPrefix(i)
		return []models.Linear{lin(pre + Query), lin(pre + Key), lin(pre + Value)}
	}
	norm := func(path string, shared bool, into ...models.Linear) models.Fold {
		return models.Fold{Gamma: path + ".weight", Beta: path + ".bias", Shared: shared, Linears: into}
	}
	out := []models.Fold{norm(cfg.Prefix()+EmbeddingsNorm, true, qkv(0)...)}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		pre := cfg.LayerPrefix(i)
		out = append(out, norm(pre+AttnNorm, true, lin(pre+Intermediate)))
		switch {
		case i+1 < cfg.NumHiddenLayers:
			out = append(out, norm(pre+OutputNorm, true, qkv(i+1)...))
		case cfg.Head != HeadNone:
			out = append(out, norm(pre+OutputNorm, false, lin(cfg.heads()[0])))
		}
	}
	return out
}

// lastFolded reports whether the last layer's output LayerNorm is folded into the head under MS-LN.
func (c Config) lastFolded() bool { return c.Head != HeadNone }
