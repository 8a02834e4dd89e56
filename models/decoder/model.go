package decoder

import (
	"fmt"
	"math"
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
)

// LayerPrefix returns the name prefix of decoder layer i: "model.layers.{i}.".
func LayerPrefix(i int) string { return fmt.Sprintf("model.layers.%d.", i) }

// Options choose the memory-saving modes a model is built in (models.Options; the approximate activation is
// ReSiLU2 in the gated MLP, MS-RMSNorm folds input_layernorm into q/k/v, post_attention_layernorm into gate/up,
// and model.norm into the head when the head is not tied to the embeddings).
type Options = models.Options

// Model is a LLaMA (LlamaForCausalLM or LlamaForSequenceClassification) ready to be built into graphs.
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

// Shapes returns every parameter name of cfg's model with its shape.
func Shapes(cfg Config) map[string][]int {
	d, m := cfg.HiddenSize, cfg.IntermediateSize
	q, kv := cfg.NumAttentionHeads*cfg.HeadDim, cfg.NumKeyValueHeads*cfg.HeadDim
	s := map[string][]int{EmbedTokens: {cfg.VocabSize, d}, FinalNorm: {d}}
	switch cfg.head() {
	case Score:
		s[Score] = []int{len(cfg.Labels), d}
	case LMHead:
		s[LMHead] = []int{cfg.VocabSize, d}
	}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		pre := LayerPrefix(i)
		s[pre+InputNorm] = []int{d}
		s[pre+PostNorm] = []int{d}
		for _, l := range []struct {
			name    string
			out, in int
			bias    bool
		}{{QProj, q, d, cfg.AttentionBias}, {KProj, kv, d, cfg.AttentionBias}, {VProj, kv, d, cfg.AttentionBias},
			{OProj, d, q, cfg.AttentionBias}, {GateProj, m, d, cfg.MLPBias}, {UpProj, m, d, cfg.MLPBias}, {DownProj, d, m, cfg.MLPBias}} {
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

// Folds lists the MS-RMSNorm folds of cfg's model: which norm's weight goes into which linear layers.
func Folds(cfg Config) []models.Fold {
	var out []models.Fold
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		pre := LayerPrefix(i)
		out = append(out,
			models.Fold{Gamma: pre + InputNorm, Linears: []models.Linear{linear(pre, QProj), linear(pre, KProj), linear(pre, VProj)}},
			models.Fold{Gamma: pre + PostNorm, Linears: []models.Linear{linear(pre, GateProj), linear(pre, UpProj)}})
	}
	if h := cfg.head(); h != EmbedTokens {
		out = append(out, models.Fold{Gamma: FinalNorm, Linears: []models.Linear{{Weight: h}}})
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

// RandomParams returns freshly initialised parameters for cfg, as transformers' LLaMA initialisation does:
// linear and embedding weights normal(0, 0.02), biases zero, RMSNorm weights one.
func RandomParams(cfg Config, seed uint64) models.Params {
	return models.RandomParams(Shapes(cfg), seed, 0x11a, func(name string, dims []int) models.Init {
		switch {
		case len(dims) == 1 && (name == FinalNorm || strings.HasSuffix(name, InputNorm) || strings.HasSuffix(name, PostNorm)):
			return models.Init{Const: 1}
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
	x := embedTokens(b.Node(EmbedTokens), inputIDs)
	out := Outputs{Hidden: []*graph.Node{x}}
	rope := newRotary(inputIDs.Graph(), cfg, seq, x.DType())
	mask := attention.Mask{Causal: true, KeyPadding: attentionMask}
	if positionIDs != nil {
		if positionIDs.Rank() != 2 || positionIDs.Shape().Dim(0) != batch || positionIDs.Shape().Dim(1) != seq || !positionIDs.DType().IsInt() {
			panic(fmt.Sprintf("decoder: position_ids must be integer [%d, %d], got %s", batch, seq, positionIDs.Shape()))
		}
		pos := graph.ConvertDType(positionIDs, dtypes.Int32)
		rope = rope.at(pos)
		mask.Segments = graph.Sub(graph.Iota(inputIDs.Graph(), shapes.Make(dtypes.Int32, batch, seq), 1), pos)
	}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		prefix := LayerPrefix(i)
		mode, perBlock := models.Mode(m.Options.Blocks, i, m.Options.ApproxActivation, m.Options.GradCheckpoint)
		x = b.ApplyBlock(prefix, x, mode, perBlock, func(b models.Bound, x *graph.Node) *graph.Node {
			attend := func(q, k, v *graph.Node) *graph.Node {
				mask := mask
				mask.Keep = b.AttentionKeep()
				q, k = rope.apply(q, cfg.NumAttentionHeads), rope.apply(k, cfg.NumKeyValueHeads)
				return attention.Attention(m.Options.Attention, q, k, v, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, mask)
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

// finalNorm applies model.norm to x (MS-RMSNorm without its affine when that was folded into the head, which
// folded reports).
func (m *Model) finalNorm(b models.Bound, x *graph.Node) (normed *graph.Node, folded bool) {
	cfg := m.Config
	if m.Options.MSNorm && cfg.head() != EmbedTokens {
		return msnorm.MSRMSNorm(x, cfg.RMSNormEps), true
	}
	return msnorm.RMSNorm(x, b.Node(FinalNorm), cfg.RMSNormEps, false), false
}

// hiddenAfterNorm is the last hidden state of transformers' convention: the final norm of x, nil when folded.
func (m *Model) hiddenAfterNorm(b models.Bound, x *graph.Node) *graph.Node {
	if m.Options.MSNorm && m.Config.head() != EmbedTokens {
		return nil
	}
	return msnorm.RMSNorm(x, b.Node(FinalNorm), m.Config.RMSNormEps, false)
}

// head applies the causal LM's output projection to the normed hidden states.
func (m *Model) head(b models.Bound, normed *graph.Node) *graph.Node {
	if m.Config.head() == EmbedTokens {
		// Tied head: the embedding table is not a linear layer of its own, adapters do not apply.
		return engine.Linear(normed, b.Node(EmbedTokens), nil)
	}
	return b.ApplyLinear("lm_head", normed)
}

// layer applies decoder layer pre to x:
//
//	h = x + o_proj(Attention(RoPE(q_proj(n1)), RoPE(k_proj(n1)), v_proj(n1)))   n1 = RMSNorm(x)
//	y = h + down_proj(SiLU(gate_proj(n2)) * up_proj(n2))                          n2 = RMSNorm(h)
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
		return b.Keep(quant.MesaLinear, msnorm.Affine(z, node(gamma), nil, false), -1)
	}
	n1 := norm(x, InputNorm)
	ctx := attend(lin(n1, QProj), lin(n1, KProj), lin(n1, VProj))
	h := graph.Add(x, lin(b.Keep(quant.MesaLinear, ctx, -1), OProj))

	n2 := norm(h, PostNorm)
	act := approxbp.SiLU
	if approx {
		act = approxbp.ReSiLU2
	}
	s, u := act(b.Keep(quant.MesaActivation, lin(n2, GateProj), -1)), lin(n2, UpProj)
	// The gated product's backward: ds = v*u, du = v*s, reading its factors through engine.Fresh (the same
	// barrier outputs the rebuild below reads, when there is one, so the factors are not copied for it).
	gated := engine.SetVJP(graph.Mul(s, u), engine.KindOther, func(node, v *graph.Node) []*graph.Node {
		fs, fu := engine.Fresh(s), engine.Fresh(u)
		return []*graph.Node{graph.Mul(v, fu), graph.Mul(v, fs)}
	})
	if approx {
		// Memory sharing in the gated product: the product's own backward keeps its factors s = SiLU(gate) and
		// u = up, and ReSiLU2 keeps only 2-bit codes of the gate, so the down projection's input s*u is rebuilt
		// from those two saved tensors when its backward needs it (one elementwise multiply) instead of being
		// kept as a third [B,T,intermediate] tensor. Exact: the rebuilt value is the forward value bit for bit.
		// The factors are read through engine.Recompute, an optimization barrier, so that no backend merges the
		// rebuild back into the forward product (GoMLX v0.28's Go backend de-duplicates identical nodes, XLA
		// eliminates common subexpressions), which would keep the forward value alive after all.
		gated = engine.Recomputable(gated, func() *graph.Node {
			f := engine.Recompute(s, u)
			return graph.Mul(f[0], f[1])
		})
	}
	return graph.Add(h, lin(b.Keep(quant.MesaLinear, gated, -1), DownProj))
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

// rotary holds the cos and sin tables of rotary position embeddings for positions 0..T-1, [1, T, 1, Dh] each
// (the two halves of a head share the same angles).
type rotary struct {
	cos, sin *graph.Node
	dh       int
}

// newRotary builds the tables as transformers does: angle = position * inv_freq (float32), then cos and sin.
func newRotary(g *graph.Graph, cfg Config, seq int, dtype dtypes.DType) rotary {
	inv := cfg.InvFreq()
	dh := cfg.HeadDim
	cos := make([]float32, seq*dh)
	sin := make([]float32, seq*dh)
	for t := 0; t < seq; t++ {
		for i, f := range inv {
			angle := float64(float32(t) * f)
			c, s := float32(math.Cos(angle)), float32(math.Sin(angle))
			cos[t*dh+i], cos[t*dh+i+dh/2] = c, c
			sin[t*dh+i], sin[t*dh+i+dh/2] = s, s
		}
	}
	mk := func(v []float32) *graph.Node {
		n := graph.Const(g, tensors.FromFlatDataAndDimensions(v, 1, seq, 1, dh))
		if dtype != dtypes.Float32 {
			n = graph.ConvertDType(n, dtype)
		}
		return n
	}
	return rotary{cos: mk(cos), sin: mk(sin), dh: dh}
}

// at returns the tables at the given positions [B, T] (int32, each below the tables' length): [B, T, 1, Dh].
func (r rotary) at(pos *graph.Node) rotary {
	b, t := pos.Shape().Dim(0), pos.Shape().Dim(1)
	pick := func(table *graph.Node) *graph.Node {
		rows := graph.Reshape(table, table.Shape().Dim(1), r.dh) // [T, Dh]
		return graph.Reshape(graph.Gather(rows, graph.InsertAxes(pos, -1)), b, t, 1, r.dh)
	}
	return rotary{cos: pick(r.cos), sin: pick(r.sin), dh: r.dh}
}

// apply rotates x [B, T, heads*Dh] with the "rotate half" convention: x*cos + rotate_half(x)*sin, where
// rotate_half(x) = concat(-x2, x1) for the halves x1, x2 of each head. The gradient flows through the
// multiplications by constant tables, a negation, two slices and a concatenation: none keeps a tensor.
func (r rotary) apply(x *graph.Node, heads int) *graph.Node {
	b, t := x.Shape().Dim(0), x.Shape().Dim(1)
	x4 := graph.Reshape(x, b, t, heads, r.dh)
	half := r.dh / 2
	x1 := engine.SliceAxis(x4, 3, 0, half)
	x2 := engine.SliceAxis(x4, 3, half, r.dh)
	rot := graph.Concatenate([]*graph.Node{graph.Neg(x2), x1}, 3)
	y := graph.Add(graph.Mul(x4, r.cos), graph.Mul(rot, r.sin))
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
