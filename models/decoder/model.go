package decoder

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/approxbp"
	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/hfconfig"
	"github.com/memfit/memfit/msnorm"
	"github.com/memfit/memfit/quant"
)

// Hugging Face parameter names.
const (
	EmbedTokens = "model.embed_tokens.weight"
	FinalNorm   = "model.norm.weight"
	LMHead      = "lm_head.weight"
	Score       = "score.weight"

	InputNorm = "input_layernorm.weight"
	PostNorm  = "post_attention_layernorm.weight"
	QProj     = "self_attn.q_proj"
	KProj     = "self_attn.k_proj"
	VProj     = "self_attn.v_proj"
	OProj     = "self_attn.o_proj"
	GateProj  = "mlp.gate_proj"
	UpProj    = "mlp.up_proj"
	DownProj  = "mlp.down_proj"

	// Under the switches: fused projections (Phi-3), q/k norms (Qwen3, Gemma 3), Gemma's MLP norms (with
	// SandwichNorms, PostNorm normalises the attention output and PreFFNorm is the MLP's input norm).
	QKVProj    = "self_attn.qkv_proj"
	GateUpProj = "mlp.gate_up_proj"
	QNorm      = "self_attn.q_norm.weight"
	KNorm      = "self_attn.k_norm.weight"
	PreFFNorm  = "pre_feedforward_layernorm.weight"
	PostFFNorm = "post_feedforward_layernorm.weight"
)

// LayerPrefix returns the name prefix of decoder layer i: "model.layers.{i}.".
func LayerPrefix(i int) string { return fmt.Sprintf("model.layers.%d.", i) }

// Options choose the memory-saving modes a model is built in (models.Options; the approximate activation is
// ReSiLU2 in the gated MLP, MS-RMSNorm folds input_layernorm into q/k/v, post_attention_layernorm into gate/up,
// and model.norm into the head when the head is not tied to the embeddings).
type Options = models.Options

// Model is a decoder (a ...ForCausalLM or ...ForSequenceClassification of any family on this graph) ready to be
// built into graphs.
type Model struct {
	Config  Config
	Options Options
	// Params are the graph's parameters by Hugging Face name; with MSNorm, folded.
	Params models.Params
	// Folded holds the original tensors of the norms removed by folding, for export.
	Folded models.Params
}

// TextSpec describes the model's tokens and task (models.TextModel): what tokenizing, padding, generating and
// evaluating need to know of it.
func (m *Model) TextSpec() models.TextSpec {
	c := m.Config
	return models.TextSpec{VocabSize: c.VocabSize, MaxPositions: c.MaxPositionEmbeddings, PadID: c.PadTokenID,
		BOSID: c.BOSTokenID, EOSIDs: c.EOSIDs(), Task: c.Task, Labels: c.Labels}
}

// head returns the name of the output projection: lm_head, score, or the embeddings when tied.
func (c Config) head() string {
	switch {
	case c.Classifier():
		return Score
	case c.TieWordEmbeddings:
		return EmbedTokens
	}
	return LMHead
}

// mlpNorm returns the name of the MLP's input norm: pre_feedforward_layernorm with SandwichNorms (Gemma), else
// post_attention_layernorm.
func (c Config) mlpNorm() string {
	if c.SandwichNorms {
		return PreFFNorm
	}
	return PostNorm
}

// Shapes returns every parameter name of cfg's model with its shape.
func Shapes(cfg Config) map[string][]int {
	d, m, hd := cfg.HiddenSize, cfg.IntermediateSize, cfg.HeadDim
	q, kv := cfg.NumAttentionHeads*hd, cfg.NumKeyValueHeads*hd
	s := map[string][]int{EmbedTokens: {cfg.VocabSize, d}, FinalNorm: {d}}
	switch cfg.head() {
	case Score:
		s[Score] = []int{len(cfg.Labels), d}
	case LMHead:
		s[LMHead] = []int{cfg.VocabSize, d}
	}
	type lin struct {
		name    string
		out, in int
		bias    bool
	}
	qkvBias := cfg.AttentionBias || cfg.QKVBias
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		pre := LayerPrefix(i)
		s[pre+InputNorm] = []int{d}
		s[pre+PostNorm] = []int{d}
		if cfg.SandwichNorms {
			s[pre+PreFFNorm], s[pre+PostFFNorm] = []int{d}, []int{d}
		}
		if cfg.QKNorm {
			s[pre+QNorm], s[pre+KNorm] = []int{hd}, []int{hd}
		}
		lins := []lin{{OProj, d, q, cfg.AttentionBias}, {DownProj, d, m, cfg.MLPBias}}
		if cfg.FusedQKV {
			lins = append(lins, lin{QKVProj, q + 2*kv, d, qkvBias})
		} else {
			lins = append(lins, lin{QProj, q, d, qkvBias}, lin{KProj, kv, d, qkvBias}, lin{VProj, kv, d, qkvBias})
		}
		if cfg.FusedGateUp {
			lins = append(lins, lin{GateUpProj, 2 * m, d, cfg.MLPBias})
		} else {
			lins = append(lins, lin{GateProj, m, d, cfg.MLPBias}, lin{UpProj, m, d, cfg.MLPBias})
		}
		for _, l := range lins {
			s[pre+l.name+".weight"] = []int{l.out, l.in}
			if l.bias {
				s[pre+l.name+".bias"] = []int{l.out}
			}
		}
	}
	return s
}

func linear(pre, name string) models.Linear {
	return models.Linear{Weight: pre + name + ".weight", Bias: pre + name + ".bias"}
}

// Folds lists the MS-RMSNorm folds of cfg's model: each norm whose output feeds only linear layers gives its
// weight (1 + weight with NormPlusOne) to them: input_layernorm to q/k/v (or qkv_proj), the MLP's input norm
// (post_attention_layernorm, Gemma's pre_feedforward_layernorm) to gate/up (or gate_up_proj), model.norm to the
// head when the head is not tied to the embeddings. The others cannot fold: Gemma's post-attention and
// post-feedforward norms feed the residual stream (an addition, not a linear layer), and the q/k norms feed
// RoPE, which mixes dimension i with i + rotary_dim/2, so a per-dimension scale does not pass through it (nor
// through the attention scores) onto a weight.
func Folds(cfg Config) []models.Fold {
	var out []models.Fold
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		pre := LayerPrefix(i)
		attn := []models.Linear{linear(pre, QProj), linear(pre, KProj), linear(pre, VProj)}
		if cfg.FusedQKV {
			attn = []models.Linear{linear(pre, QKVProj)}
		}
		mlp := []models.Linear{linear(pre, GateProj), linear(pre, UpProj)}
		if cfg.FusedGateUp {
			mlp = []models.Linear{linear(pre, GateUpProj)}
		}
		out = append(out,
			models.Fold{Gamma: pre + InputNorm, PlusOne: cfg.NormPlusOne, Linears: attn},
			models.Fold{Gamma: pre + cfg.mlpNorm(), PlusOne: cfg.NormPlusOne, Linears: mlp})
	}
	if h := cfg.head(); h != EmbedTokens {
		out = append(out, models.Fold{Gamma: FinalNorm, PlusOne: cfg.NormPlusOne, Linears: []models.Linear{{Weight: h}}})
	}
	return out
}

// Architecture returns what building cfg's model from its weights needs (models.Prepare).
func Architecture(cfg Config) models.Architecture {
	return models.Architecture{Shapes: Shapes(cfg), Folds: Folds(cfg), Blocks: cfg.NumHiddenLayers}
}

// New checks params against cfg and returns the model in the given modes, folding the norms when opts.MSNorm.
func New(cfg Config, params models.Params, opts Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p, folded, err := models.Prepare(Architecture(cfg), params, opts.Blocks, opts.MSNorm)
	if err != nil {
		return nil, err
	}
	return &Model{Config: cfg, Options: opts, Params: p, Folded: folded}, nil
}

// RandomParams returns freshly initialised parameters for cfg, as transformers' initialisation does: linear and
// embedding weights normal(0, 0.02), biases zero, RMSNorm weights one (zero with NormPlusOne: Gemma's norms
// scale by 1 + weight).
func RandomParams(cfg Config, seed uint64) models.Params {
	norm := float32(1)
	if cfg.NormPlusOne {
		norm = 0
	}
	return models.RandomParams(Shapes(cfg), seed, 0x11a, func(name string, dims []int) models.Init {
		switch {
		case len(dims) == 1 && strings.HasSuffix(name, "norm.weight"):
			return models.Init{Const: norm}
		case len(dims) == 1:
			return models.Init{}
		}
		return models.Init{Std: 0.02}
	})
}

// Outputs are the nodes a forward pass produces.
type Outputs struct {
	// Logits are [B, T, vocab] for the causal LM and [B, labels] for the classifier (pooled at each row's last
	// non-pad token).
	Logits *graph.Node
	// Hidden are the token embeddings, every layer's output but the last, and the last layer's output after the
	// final norm (transformers' hidden_states convention); the last is nil when the final norm was folded.
	Hidden []*graph.Node
	// PooledPositions are the classifier's token positions per row, [B] int32 (nil for the causal LM).
	PooledPositions *graph.Node
}

// Forward builds the model on inputIDs [B, T] (integer token ids) with attentionMask [B, T] (1 for real tokens,
// 0 for padding; nil when there is no padding). Positions are 0..T-1 in every row, as transformers uses by
// default; a query sees the keys at positions up to its own that the mask keeps.
func (m *Model) Forward(b models.Bound, inputIDs, attentionMask *graph.Node) Outputs {
	return m.ForwardPacked(b, inputIDs, attentionMask, nil)
}

// ForwardPacked is Forward over packed sequences: positionIDs [B, T] (integers; nil is Forward) give each
// token's position within its own document, 0 at each document's first token, as Hugging Face's
// DataCollatorWithFlattening gives them. Rotary embeddings take those positions, and a query attends only to the
// keys of its own document (block-diagonal causal attention): a token's document is identified by t -
// positionIDs[t], its document's first index, which the positions of one document share and the next document
// (restarting at 0) does not. Each document is therefore computed exactly as it would be alone in a row.
func (m *Model) ForwardPacked(b models.Bound, inputIDs, attentionMask, positionIDs *graph.Node) Outputs {
	cfg := m.Config
	if inputIDs.Rank() != 2 || !inputIDs.DType().IsInt() {
		panic(fmt.Sprintf("decoder: input_ids must be integer [B, T], got %s", inputIDs.Shape()))
	}
	batch, seq := inputIDs.Shape().Dim(0), inputIDs.Shape().Dim(1)
	if attentionMask != nil && (attentionMask.Rank() != 2 || attentionMask.Shape().Dim(0) != batch || attentionMask.Shape().Dim(1) != seq) {
		panic(fmt.Sprintf("decoder: attention_mask must be [%d, %d], got %s", batch, seq, attentionMask.Shape()))
	}
	x := m.embed(b, inputIDs)
	out := Outputs{Hidden: []*graph.Node{x}}
	ropes := newRotaries(inputIDs.Graph(), cfg, seq, seq, x.DType())
	mask := attention.Mask{Causal: true, KeyPadding: attentionMask, SoftCap: cfg.AttnSoftCap}
	if positionIDs != nil {
		if positionIDs.Rank() != 2 || positionIDs.Shape().Dim(0) != batch || positionIDs.Shape().Dim(1) != seq || !positionIDs.DType().IsInt() {
			panic(fmt.Sprintf("decoder: position_ids must be integer [%d, %d], got %s", batch, seq, positionIDs.Shape()))
		}
		pos := graph.ConvertDType(positionIDs, dtypes.Int32)
		ropes = ropes.at(pos)
		mask.Segments = graph.Sub(graph.Iota(inputIDs.Graph(), shapes.Make(dtypes.Int32, batch, seq), 1), pos)
	}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		prefix := LayerPrefix(i)
		mode, perBlock := models.Mode(m.Options.Blocks, i, m.Options.ApproxActivation, m.Options.GradCheckpoint)
		rope, mask := ropes.layer(cfg, i), m.layerMask(mask, i)
		x = b.ApplyBlock(prefix, x, mode, perBlock, func(b models.Bound, x *graph.Node) *graph.Node {
			attend := func(q, k, v *graph.Node) *graph.Node {
				mask := mask
				mask.Keep = b.AttentionKeep()
				q, k = rope.apply(q, cfg.NumAttentionHeads), rope.apply(k, cfg.NumKeyValueHeads)
				return attention.Attention(m.Options.Attention, m.scaleQuery(q), k, v, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, mask)
			}
			return m.layer(b, prefix, x, attend, mode.ApproxActivation)
		})
		if i < cfg.NumHiddenLayers-1 {
			out.Hidden = append(out.Hidden, x)
		}
	}
	if cfg.Classifier() {
		// The head reads one token per row, and the norm and the head act per token: pool first.
		pos := lastTokenPositions(inputIDs, cfg.PadTokenID)
		out.PooledPositions = pos
		onehot := graph.InsertAxes(graph.OneHot(pos, seq, x.DType()), -1) // [B, T, 1]
		pooled := graph.ReduceSum(graph.Mul(x, onehot), 1)
		out.Hidden = append(out.Hidden, m.hiddenAfterNorm(b, x))
		normed, _ := m.finalNorm(b, pooled)
		out.Logits = b.ApplyLinear("score", normed)
		return out
	}
	normed, folded := m.finalNorm(b, x)
	if folded {
		out.Hidden = append(out.Hidden, nil)
	} else {
		out.Hidden = append(out.Hidden, normed)
	}
	out.Logits = m.head(b, normed)
	return out
}

// embed looks the token ids up in the embedding table, scaled by sqrt(hidden_size) with EmbedScale (Gemma: the
// scale as a float32 constant, as transformers' normalizer).
func (m *Model) embed(b models.Bound, ids *graph.Node) *graph.Node {
	x := embedTokens(b.Node(EmbedTokens), ids)
	if m.Config.EmbedScale {
		x = graph.MulScalar(x, float64(float32(math.Sqrt(float64(m.Config.HiddenSize)))))
	}
	return x
}

// layerMask returns the attention mask of layer i: mask, with the sliding window on a sliding layer.
func (m *Model) layerMask(mask attention.Mask, i int) attention.Mask {
	if m.Config.IsSliding(i) {
		mask.Window = m.Config.SlidingWindow
	}
	return mask
}

// scaleQuery rescales q so that the attention's 1/sqrt(head_dim) becomes 1/sqrt(query_pre_attn_scalar) (Gemma):
// q * sqrt(head_dim / query_pre_attn_scalar); q itself without QueryPreAttnScalar.
func (m *Model) scaleQuery(q *graph.Node) *graph.Node {
	c := m.Config
	if c.QueryPreAttnScalar <= 0 || c.QueryPreAttnScalar == float64(c.HeadDim) {
		return q
	}
	return graph.MulScalar(q, math.Sqrt(float64(c.HeadDim)/c.QueryPreAttnScalar))
}

// finalNorm applies model.norm to x (MS-RMSNorm without its affine when that was folded into the head, which
// folded reports).
func (m *Model) finalNorm(b models.Bound, x *graph.Node) (normed *graph.Node, folded bool) {
	cfg := m.Config
	if m.Options.MSNorm && cfg.head() != EmbedTokens {
		return msnorm.MSRMSNorm(x, cfg.RMSNormEps), true
	}
	return msnorm.RMSNorm(x, b.Node(FinalNorm), cfg.RMSNormEps, cfg.NormPlusOne), false
}

// hiddenAfterNorm is the last hidden state of transformers' convention: the final norm of x, nil when folded.
func (m *Model) hiddenAfterNorm(b models.Bound, x *graph.Node) *graph.Node {
	if m.Options.MSNorm && m.Config.head() != EmbedTokens {
		return nil
	}
	return msnorm.RMSNorm(x, b.Node(FinalNorm), m.Config.RMSNormEps, m.Config.NormPlusOne)
}

// head applies the causal LM's output projection to the normed hidden states, then the final soft-cap
// (FinalSoftCap: Gemma 2).
func (m *Model) head(b models.Bound, normed *graph.Node) *graph.Node {
	var logits *graph.Node
	if m.Config.head() == EmbedTokens {
		// Tied head: the embedding table is not a linear layer of its own, adapters do not apply.
		logits = engine.Linear(normed, b.Node(EmbedTokens), nil)
	} else {
		logits = b.ApplyLinear("lm_head", normed)
	}
	return softCap(logits, m.Config.FinalSoftCap)
}

// softCap returns c * tanh(x / c) (x when c is not positive).
//
// Backward: d/dx c tanh(x/c) = 1 - tanh²(x/c) = 1 - (y/c)², read from the output y, which the loss keeps anyway
// (the cross entropy's backward reads its logits): the tanh is not kept as well.
func softCap(x *graph.Node, c float64) *graph.Node {
	if c <= 0 {
		return x
	}
	a := engine.PassThrough(graph.MulScalar(x, 1/c), engine.KindOther, 0)
	t := engine.PassThrough(graph.Tanh(a), engine.KindOther, 0)
	return engine.SetVJP(graph.MulScalar(t, c), engine.KindOther, func(node, v *graph.Node) []*graph.Node {
		y := engine.Fresh(node)
		grads := make([]*graph.Node, len(node.Inputs()))
		grads[0] = graph.Mul(v, graph.OneMinus(graph.Square(graph.MulScalar(y, 1/c))))
		return grads
	})
}

// layer applies decoder layer pre to x:
//
//	h = x + o_proj(Attention(RoPE(q_proj(n1)), RoPE(k_proj(n1)), v_proj(n1)))   n1 = RMSNorm(x)
//	y = h + down_proj(act(gate_proj(n2)) * up_proj(n2))                          n2 = RMSNorm(h)
//
// and, under the switches: q, k and v from one qkv_proj, gate and up from one gate_up_proj (Phi-3), q and k
// normalised per head before RoPE (Qwen3, Gemma 3), the attention and MLP outputs normalised before they join
// the residual stream, n2 from pre_feedforward_layernorm (Gemma), GELU (tanh form) in place of SiLU (Gemma),
// norms scaling by 1 + weight (Gemma).
//
// attend takes the projections q [B, T, H*Dh], k and v [B, T, Hkv*Dh] before rotary embeddings and returns the
// attention's context [B, T, H*Dh]: training attends within the sequence, decoding through a key/value cache.
func (m *Model) layer(b models.Bound, pre string, x *graph.Node, attend func(q, k, v *graph.Node) *graph.Node, approx bool) *graph.Node {
	cfg := m.Config
	node := func(name string) *graph.Node { return b.Node(pre + name) }
	lin := func(in *graph.Node, name string) *graph.Node { return b.ApplyLinear(pre+name, in) }
	// Under Mesa (b.Keep), the norm output z and the linear inputs are kept as int8; with MS-RMSNorm z is both.
	norm := func(x *graph.Node, gamma string) *graph.Node {
		z := b.Keep(quant.MesaNorm, msnorm.MSRMSNorm(x, cfg.RMSNormEps), -1)
		if m.Options.MSNorm {
			return b.Keep(quant.MesaLinear, z, -1)
		}
		return b.Keep(quant.MesaLinear, msnorm.Affine(z, node(gamma), nil, cfg.NormPlusOne), -1)
	}
	// A norm that cannot fold (its output feeds the residual stream or RoPE) keeps its affine under MS-norm.
	plainNorm := func(x *graph.Node, gamma string) *graph.Node {
		return msnorm.RMSNorm(x, node(gamma), cfg.RMSNormEps, cfg.NormPlusOne)
	}
	n1 := norm(x, InputNorm)
	var q, k, v *graph.Node
	if cfg.FusedQKV {
		qkv := lin(n1, QKVProj)
		nq, nkv := cfg.NumAttentionHeads*cfg.HeadDim, cfg.NumKeyValueHeads*cfg.HeadDim
		q, k, v = engine.SliceAxis(qkv, -1, 0, nq), engine.SliceAxis(qkv, -1, nq, nq+nkv), engine.SliceAxis(qkv, -1, nq+nkv, nq+2*nkv)
	} else {
		q, k, v = lin(n1, QProj), lin(n1, KProj), lin(n1, VProj)
	}
	if cfg.QKNorm {
		q, k = m.headNorm(q, node(QNorm), cfg.NumAttentionHeads), m.headNorm(k, node(KNorm), cfg.NumKeyValueHeads)
	}
	ctx := attend(q, k, v)
	a := lin(b.Keep(quant.MesaLinear, ctx, -1), OProj)
	if cfg.SandwichNorms {
		a = plainNorm(a, PostNorm)
	}
	h := graph.Add(x, a)

	n2 := norm(h, cfg.mlpNorm())
	var gateIn, u *graph.Node
	if cfg.FusedGateUp {
		gu := lin(n2, GateUpProj)
		gateIn, u = engine.SliceAxis(gu, -1, 0, cfg.IntermediateSize), engine.SliceAxis(gu, -1, cfg.IntermediateSize, 2*cfg.IntermediateSize)
	} else {
		gateIn, u = lin(n2, GateProj), lin(n2, UpProj)
	}
	s := m.activation(approx)(b.Keep(quant.MesaActivation, gateIn, -1))
	// The gated product's backward: ds = v*u, du = v*s, reading its factors through engine.Fresh (the same
	// barrier outputs the rebuild below reads, when there is one, so the factors are not copied for it).
	gated := engine.SetVJP(graph.Mul(s, u), engine.KindOther, func(node, v *graph.Node) []*graph.Node {
		fs, fu := engine.Fresh(s), engine.Fresh(u)
		return []*graph.Node{graph.Mul(v, fu), graph.Mul(v, fs)}
	})
	if approx {
		// Memory sharing in the gated product: the product's own backward keeps its factors s = act(gate) and
		// u = up, and the approximate activation keeps only 2-bit codes of the gate, so the down projection's
		// input s*u is rebuilt from those two saved tensors when its backward needs it (one elementwise multiply)
		// instead of being kept as a third [B,T,intermediate] tensor. Exact: the rebuilt value is the forward
		// value bit for bit. The factors are read through engine.Recompute, an optimization barrier, so that no
		// backend merges the rebuild back into the forward product (GoMLX v0.28's Go backend de-duplicates
		// identical nodes, XLA eliminates common subexpressions), which would keep the forward value alive after
		// all.
		gated = engine.Recomputable(gated, func() *graph.Node {
			f := engine.Recompute(s, u)
			return graph.Mul(f[0], f[1])
		})
	}
	mlp := lin(b.Keep(quant.MesaLinear, gated, -1), DownProj)
	if cfg.SandwichNorms {
		mlp = plainNorm(mlp, PostFFNorm)
	}
	return graph.Add(h, mlp)
}

// activation returns the gated MLP's activation: SiLU or the tanh GELU, exact, or with the 2-bit approximate
// backward (ReSiLU2, ReGELU2 fitted to the tanh GELU) when approx.
func (m *Model) activation(approx bool) func(*graph.Node) *graph.Node {
	switch {
	case m.Config.Activation == ActGELUTanh && approx:
		return approxbp.ReGELU2Tanh
	case m.Config.Activation == ActGELUTanh:
		return approxbp.GELUTanh
	case approx:
		return approxbp.ReSiLU2
	}
	return approxbp.SiLU
}

// headNorm applies RMSNorm with gamma [head_dim] to each head of x [B, T, heads*head_dim] (the q/k norms).
func (m *Model) headNorm(x, gamma *graph.Node, heads int) *graph.Node {
	bt, t := x.Shape().Dim(0), x.Shape().Dim(1)
	x4 := graph.Reshape(x, bt, t, heads, m.Config.HeadDim)
	return graph.Reshape(msnorm.RMSNorm(x4, gamma, m.Config.RMSNormEps, m.Config.NormPlusOne), bt, t, heads*m.Config.HeadDim)
}

// embedTokens looks the ids up in the embedding table [vocab, D] with a Gather (its gradient scatters into the
// rows used).
func embedTokens(table, ids *graph.Node) *graph.Node {
	return graph.Gather(table, graph.InsertAxes(graph.ConvertDType(ids, dtypes.Int32), -1))
}

// lastTokenPositions returns, per row, the position before the first pad token, or the last position when the
// row has none: transformers' (argmax(ids == pad) - 1) mod T.
func lastTokenPositions(ids *graph.Node, pad int) *graph.Node {
	g := ids.Graph()
	seq := ids.Shape().Dim(1)
	isPad := graph.Equal(graph.ConvertDType(ids, dtypes.Int32), graph.Scalar(g, dtypes.Int32, pad))
	first := graph.ArgMax(graph.ConvertDType(isPad, dtypes.Int32), 1, dtypes.Int32)
	return graph.Rem(graph.AddScalar(first, float64(seq-1)), graph.Scalar(g, dtypes.Int32, seq))
}

// rotary holds the cos and sin tables of rotary position embeddings for positions 0..T-1, [1, T, 1, Dr] each
// (the two halves of the rotated dimensions share the same angles), Dr the rotated dimensions of a head of dh.
type rotary struct {
	cos, sin *graph.Node
	dr, dh   int
}

// rotaries are the rotary tables of a model's layers: the full-attention layers', and the sliding layers' when
// they differ (Gemma 3's local base; nil otherwise).
type rotaries struct{ global, local *rotary }

// newRotaries builds the tables of cfg for positions 0..seq-1, for a sequence whose largest position is length-1
// (longrope's factors depend on it).
func newRotaries(g *graph.Graph, cfg Config, seq, length int, dtype dtypes.DType) rotaries {
	global := newRotary(g, cfg.RopeFor(false, length), cfg.HeadDim, seq, dtype)
	r := rotaries{global: &global}
	if cfg.LocalRopeTheta > 0 && slices.Contains(cfg.Sliding, true) {
		local := newRotary(g, cfg.RopeFor(true, length), cfg.HeadDim, seq, dtype)
		r.local = &local
	}
	return r
}

// layer returns the tables of layer i.
func (r rotaries) layer(cfg Config, i int) rotary {
	if r.local != nil && cfg.IsSliding(i) {
		return *r.local
	}
	return *r.global
}

// at returns the tables at the given positions [B, T] (rotary.at).
func (r rotaries) at(pos *graph.Node) rotaries {
	g := r.global.at(pos)
	out := rotaries{global: &g}
	if r.local != nil {
		l := r.local.at(pos)
		out.local = &l
	}
	return out
}

// newRotary builds the tables as transformers does: angle = position * inv_freq (float32), then cos and sin,
// times the rope's attention scaling.
func newRotary(g *graph.Graph, rope Rope, dh, seq int, dtype dtypes.DType) rotary {
	inv := rope.InvFreq
	dr := 2 * len(inv)
	cos := make([]float32, seq*dr)
	sin := make([]float32, seq*dr)
	for t := 0; t < seq; t++ {
		for i, f := range inv {
			angle := float64(float32(t) * f)
			c, s := float32(math.Cos(angle)), float32(math.Sin(angle))
			if rope.Scale != 1 {
				c, s = c*rope.Scale, s*rope.Scale
			}
			cos[t*dr+i], cos[t*dr+i+dr/2] = c, c
			sin[t*dr+i], sin[t*dr+i+dr/2] = s, s
		}
	}
	mk := func(v []float32) *graph.Node {
		n := graph.Const(g, tensors.FromFlatDataAndDimensions(v, 1, seq, 1, dr))
		if dtype != dtypes.Float32 {
			n = graph.ConvertDType(n, dtype)
		}
		return n
	}
	return rotary{cos: mk(cos), sin: mk(sin), dr: dr, dh: dh}
}

// at returns the tables at the given positions [B, T] (int32, each below the tables' length): [B, T, 1, Dr].
func (r rotary) at(pos *graph.Node) rotary {
	b, t := pos.Shape().Dim(0), pos.Shape().Dim(1)
	pick := func(table *graph.Node) *graph.Node {
		rows := graph.Reshape(table, table.Shape().Dim(1), r.dr) // [T, Dr]
		return graph.Reshape(graph.Gather(rows, graph.InsertAxes(pos, -1)), b, t, 1, r.dr)
	}
	return rotary{cos: pick(r.cos), sin: pick(r.sin), dr: r.dr, dh: r.dh}
}

// apply rotates x [B, T, heads*Dh] with the "rotate half" convention on each head's first Dr dimensions (all of
// them but under partial rotary), the others passing unchanged: x*cos + rotate_half(x)*sin, where
// rotate_half(x) = concat(-x2, x1) for the halves x1, x2 of the rotated part. The gradient flows through the
// multiplications by constant tables, a negation, slices and concatenations: none keeps a tensor.
func (r rotary) apply(x *graph.Node, heads int) *graph.Node {
	b, t := x.Shape().Dim(0), x.Shape().Dim(1)
	x4 := graph.Reshape(x, b, t, heads, r.dh)
	rot := x4
	if r.dr < r.dh {
		rot = engine.SliceAxis(x4, 3, 0, r.dr)
	}
	half := r.dr / 2
	x1 := engine.SliceAxis(rot, 3, 0, half)
	x2 := engine.SliceAxis(rot, 3, half, r.dr)
	y := graph.Add(graph.Mul(rot, r.cos), graph.Mul(graph.Concatenate([]*graph.Node{graph.Neg(x2), x1}, 3), r.sin))
	if r.dr < r.dh {
		y = graph.Concatenate([]*graph.Node{y, engine.SliceAxis(x4, 3, r.dr, r.dh)}, 3)
	}
	return graph.Reshape(y, b, t, heads*r.dh)
}

// LinearLayers lists cfg's linear layers (q/k/v/o and gate/up/down projections of every layer, and lm_head or
// score as the head); the embedding table is not listed, nor is it when tied to the head.
func LinearLayers(cfg Config) []models.LinearLayer {
	return models.LinearLayers(Shapes(cfg), []string{"lm_head", "score"}, EmbedTokens)
}

// Load reads a model folder (config.json, decoded by its family's decode, and safetensors weights) and returns
// the model in the given modes. A tied head may also be stored as lm_head.weight (it is then ignored: the
// embeddings are the head).
func Load(dir string, decode func(hfconfig.Fields) (Config, error), opts Options) (*Model, error) {
	cfg, err := hfconfig.LoadWith(dir, decode)
	if err != nil {
		return nil, err
	}
	params, err := models.LoadParams(dir, Shapes(cfg), models.LoadOptions{Ignore: func(n string) bool {
		return cfg.TieWordEmbeddings && n == LMHead
	}})
	if err != nil {
		return nil, err
	}
	m, err := New(cfg, params, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return m, nil
}
