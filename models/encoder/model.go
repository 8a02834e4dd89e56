package encoder

import (
	"fmt"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/approxbp"
	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
	"github.com/memfit/memfit/quant"
	"github.com/memfit/memfit/safetensors"
)

// Options choose the memory-saving modes a model is built in (models.Options, as every graph takes them): ReGELU2
// in the MLP (ApproxActivation), MS-LN (MSNorm: every LayerNorm folded into the linear layers that read it,
// fold.go), the attention kind, gradient checkpointing per encoder layer and a per-block plan.
type Options = models.Options

// Model is a BERT, RoBERTa or XLM-RoBERTa encoder with its head, ready to be built into graphs.
type Model struct {
	Config  Config
	Options Options
	// Params are the graph's parameters by Hugging Face name; with MSNorm, folded.
	Params models.Params
	// Folded holds the folded norms' tensors as they were at folding time (empty without MSNorm), for export.
	Folded models.Params
}

// EncoderConfig returns the model's config; code that holds a model behind an interface (an evaluation over
// runner.Model) finds out through it that the model is an encoder and which head it has.
func (m *Model) EncoderConfig() Config { return m.Config }

// New checks params against cfg (every expected name present with its shape, nothing else) and returns the model
// in the given modes, folding the norms when opts.MSNorm.
func New(cfg Config, params models.Params, opts Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	arch := models.Architecture{Shapes: Shapes(cfg), Folds: Folds(cfg), Blocks: cfg.NumHiddenLayers}
	graphParams, folded, err := models.Prepare(arch, params, opts.Blocks, opts.MSNorm)
	if err != nil {
		return nil, err
	}
	return &Model{Config: cfg, Options: opts, Params: graphParams, Folded: folded}, nil
}

// Outputs are the nodes a forward pass produces; unused ones cost nothing.
type Outputs struct {
	// Logits are [B, labels] for a classifier (regression: [B, 1]), [B, T, vocab] for the masked LM, and the last
	// hidden state [B, T, hidden] for the bare encoder.
	Logits *graph.Node
	// Hidden are the embeddings' LayerNorm output and every layer's output, [B, T, hidden] (transformers'
	// hidden_states); under MS-LN the last is nil when the last LayerNorm was folded into the head.
	Hidden []*graph.Node
	// Pooled is BERT's pooler output tanh(dense(h[:, 0])), [B, hidden] (nil otherwise).
	Pooled *graph.Node
	// PositionIDs are the position ids used, [B, T] int32.
	PositionIDs *graph.Node
}

// Forward builds the model on inputIDs [B, T] (integer token ids) with attentionMask [B, T] (1 for real tokens,
// 0 for padding; nil: none) and tokenTypeIDs [B, T] (nil: all 0), its parameters from b (models.Bind).
// Positions are 0..T-1 for BERT and, for RoBERTa, create_position_ids_from_input_ids: padding_idx + 1 + the
// running count of non-pad tokens, and padding_idx at pad tokens. Padding keys are hidden from every query.
func (m *Model) Forward(b models.Bound, inputIDs, attentionMask, tokenTypeIDs *graph.Node) Outputs {
	cfg := m.Config
	if inputIDs.Rank() != 2 || !inputIDs.DType().IsInt() {
		panic(fmt.Sprintf("bert: input_ids must be integer [B, T], got %s", inputIDs.Shape()))
	}
	batch, seq := inputIDs.Shape().Dim(0), inputIDs.Shape().Dim(1)
	for name, n := range map[string]*graph.Node{"attention_mask": attentionMask, "token_type_ids": tokenTypeIDs} {
		if n != nil && (n.Rank() != 2 || n.Shape().Dim(0) != batch || n.Shape().Dim(1) != seq) {
			panic(fmt.Sprintf("bert: %s must be [%d, %d], got %s", name, batch, seq, n.Shape()))
		}
	}
	ms := m.Options.MSNorm
	pos := m.positionIDs(inputIDs)
	out := Outputs{PositionIDs: pos}
	p := cfg.Prefix()
	x := embeddings(b, p, inputIDs, pos, tokenTypeIDs)
	// The stream between blocks: the LayerNorm's output with its affine (plain), or without it (MS-LN).
	x = m.norm(b, x, p+EmbeddingsNorm, ms)
	prevNorm := p + EmbeddingsNorm
	out.Hidden = append(out.Hidden, m.withAffine(b, x, prevNorm))
	mask := attention.Mask{KeyPadding: attentionMask}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		pre := cfg.LayerPrefix(i)
		mode, perBlock := models.Mode(m.Options.Blocks, i, m.Options.ApproxActivation, m.Options.GradCheckpoint)
		prefixes := []string{pre}
		if ms {
			prefixes = append(prefixes, prevNorm+".")
		}
		last := i == cfg.NumHiddenLayers-1
		prev := prevNorm
		x = b.ApplyBlockOver(prefixes, x, mode, perBlock, func(b models.Bound, x *graph.Node) *graph.Node {
			return m.layer(b, pre, prev, x, mask, mode.ApproxActivation)
		})
		prevNorm = pre + OutputNorm
		if ms && last && cfg.lastFolded() {
			out.Hidden = append(out.Hidden, nil)
		} else {
			out.Hidden = append(out.Hidden, m.withAffine(b, x, prevNorm))
		}
	}
	heads := cfg.heads()
	switch cfg.Head {
	case HeadNone:
		out.Logits = out.Hidden[len(out.Hidden)-1]
	case HeadClassification:
		// The head reads the first token only: slice it before the head's layers.
		first := graph.Reshape(engine.SliceAxis(x, 1, 0, 1), batch, cfg.HiddenSize)
		pooled := graph.Tanh(b.ApplyLinear(heads[0], b.Keep(quant.MesaLinear, first, -1)))
		if !cfg.IsRoBERTa() {
			out.Pooled = pooled
		}
		out.Logits = b.ApplyLinear(heads[1], b.Keep(quant.MesaLinear, pooled, -1))
	case HeadMaskedLM:
		out.Logits = m.maskedLM(b, x)
	}
	return out
}

// norm applies the LayerNorm at path (its .weight and .bias) to s: the normalised z kept once (under Mesa as
// int8), and, unless folded, its affine. folded says the stream between blocks is z (MS-LN).
func (m *Model) norm(b models.Bound, s *graph.Node, path string, folded bool) *graph.Node {
	z := b.Keep(quant.MesaNorm, msnorm.MSLayerNorm(s, m.Config.LayerNormEps), -1)
	if folded {
		return b.Keep(quant.MesaLinear, z, -1)
	}
	return b.Keep(quant.MesaLinear, msnorm.Affine(z, b.Node(path+".weight"), b.Node(path+".bias"), false), -1)
}

// withAffine returns the residual stream of the stream x after the LayerNorm at path: x itself (plain), or
// g ∘ x + β under MS-LN (x being that norm's z).
func (m *Model) withAffine(b models.Bound, x *graph.Node, path string) *graph.Node {
	if !m.Options.MSNorm {
		return x
	}
	return msnorm.Affine(x, b.Node(path+".weight"), b.Node(path+".bias"), false)
}

// layer applies encoder layer pre to the stream x (the previous LayerNorm's output, at path prev; under MS-LN
// without its affine):
//
//	a  = LN1(x + AttnOut(Attention(Query x, Key x, Value x)))
//	h' = LN2(a + Output(GELU(Intermediate a)))
//
// Under MS-LN the residual adds use g ∘ z + β of each norm, the linear layers read z (fold.go), and the layer
// returns LN2's z.
func (m *Model) layer(b models.Bound, pre, prev string, x *graph.Node, mask attention.Mask, approx bool) *graph.Node {
	cfg := m.Config
	ms := m.Options.MSNorm
	lin := func(name string, in *graph.Node) *graph.Node { return b.ApplyLinear(pre+name, in) }
	residual := x
	if ms {
		residual = msnorm.Affine(x, b.Node(prev+".weight"), b.Node(prev+".bias"), false)
	}
	mask.Keep = b.AttentionKeep()
	ctx := attention.Attention(m.Options.Attention, lin(Query, x), lin(Key, x), lin(Value, x), cfg.NumAttentionHeads, cfg.NumAttentionHeads, mask)
	a := m.norm(b, graph.Add(lin(AttnOut, b.Keep(quant.MesaLinear, ctx, -1)), residual), pre+AttnNorm, ms)
	aRes := m.withAffine(b, a, pre+AttnNorm)
	act := approxbp.GELU
	if approx {
		act = approxbp.ReGELU2
	}
	u := act(b.Keep(quant.MesaActivation, lin(Intermediate, a), -1))
	s := graph.Add(lin(Output, b.Keep(quant.MesaLinear, u, -1)), aRes)
	return m.norm(b, s, pre+OutputNorm, ms)
}

// maskedLM applies the masked-LM head to the last layer's output x (under MS-LN its z, the last norm folded
// into the head's dense): dense, GELU, LayerNorm, then the decoder (the word embeddings, transposed, unless
// untied) plus the output bias.
func (m *Model) maskedLM(b models.Bound, x *graph.Node) *graph.Node {
	cfg := m.Config
	dense := cfg.heads()[0]
	norm, bias, decoder := cfg.mlm()
	t := approxbp.GELU(b.Keep(quant.MesaActivation, b.ApplyLinear(dense, x), -1))
	t = m.norm(b, t, norm, false)
	w := b.Node(cfg.Prefix() + WordEmbeddings)
	if !cfg.TieWordEmbeddings {
		w = b.Weight(decoder)
	}
	return engine.Linear(t, w, b.Node(bias)) // tied to the embeddings: not a linear layer adapters wrap
}

// positionIDs returns the position ids [B, T] int32: 0..T-1 (BERT), or RoBERTa's
// create_position_ids_from_input_ids: mask = ids != pad; (cumsum(mask) * mask) + pad.
func (m *Model) positionIDs(ids *graph.Node) *graph.Node {
	g := ids.Graph()
	batch, seq := ids.Shape().Dim(0), ids.Shape().Dim(1)
	if !m.Config.IsRoBERTa() {
		return graph.BroadcastToDims(graph.Iota(g, shapes.Make(dtypes.Int32, 1, seq), 1), batch, seq)
	}
	pad := m.Config.PadTokenID
	real := graph.ConvertDType(graph.NotEqual(graph.ConvertDType(ids, dtypes.Int32), graph.Scalar(g, dtypes.Int32, pad)), dtypes.Int32)
	return graph.AddScalar(graph.Mul(graph.CumSum(real, 1), real), float64(pad))
}

// embeddings returns word + token type + position embeddings, [B, T, hidden], before the embeddings' LayerNorm.
// Lookups are Gathers (their gradients scatter into the rows used).
func embeddings(b models.Bound, p string, ids, pos, types *graph.Node) *graph.Node {
	lookup := func(table, idx *graph.Node) *graph.Node {
		return graph.Gather(table, graph.InsertAxes(graph.ConvertDType(idx, dtypes.Int32), -1))
	}
	x := lookup(b.Node(p+WordEmbeddings), ids)
	tt := b.Node(p + TokenTypes)
	if types != nil {
		x = graph.Add(x, lookup(tt, types))
	} else {
		// token_type_ids default to zeros: row 0 of the table for every token.
		d := tt.Shape().Dim(1)
		x = graph.Add(x, graph.Reshape(engine.SliceAxis(tt, 0, 0, 1), 1, 1, d))
	}
	return graph.Add(x, lookup(b.Node(p+PositionEmbeddings), pos))
}

// Load reads a BERT, RoBERTa or XLM-RoBERTa model folder (config.json and safetensors weights) and returns the
// model in the given modes. Checkpoints as the Hub holds them load as transformers loads them: a bare encoder
// saved without its "bert."/"roberta." prefix, LayerNorm tensors named gamma/beta (old BERT checkpoints), the
// tied decoder stored anyway, buffers (position_ids), and the parts the model does not use (BertForPreTraining's
// next-sentence head; a pooler under a masked LM or RoBERTa) are read or skipped.
func Load(dir string, opts Options) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	params, err := LoadParams(dir, cfg)
	if err != nil {
		return nil, err
	}
	m, err := New(cfg, params, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return m, nil
}

// LoadParams reads cfg's parameters from the checkpoint in dir (see Load for the names it maps and skips).
func LoadParams(dir string, cfg Config) (models.Params, error) {
	want := Shapes(cfg)
	names, err := checkpointNames(dir)
	if err != nil {
		return nil, err
	}
	p := cfg.Prefix()
	noPrefix := !names[p+WordEmbeddings] && names[WordEmbeddings]
	rename := func(n string) string {
		if noPrefix {
			n = strings.TrimPrefix(n, p)
		}
		if _, bias, decoder := cfg.mlm(); n == bias && !names[n] && names[decoder+".bias"] {
			return decoder + ".bias" // stored only under the decoder, to which lm_head.bias is tied
		}
		if !names[n] {
			for _, sub := range [][2]string{{"LayerNorm.weight", "LayerNorm.gamma"}, {"LayerNorm.bias", "LayerNorm.beta"}} {
				if alt, ok := strings.CutSuffix(n, sub[0]); ok && names[alt+sub[1]] {
					return alt + sub[1]
				}
			}
		}
		return n
	}
	_, bias, decoder := cfg.mlm()
	ignore := func(n string) bool {
		switch {
		case strings.HasSuffix(n, "position_ids"), strings.HasPrefix(n, "cls.seq_relationship."):
			return true
		case cfg.TieWordEmbeddings && (n == decoder+".weight"), n == decoder+".bias" && names[bias]:
			return true
		case strings.HasPrefix(n, "pooler.") || strings.Contains(n, ".pooler."):
			return cfg.Head != HeadClassification || cfg.IsRoBERTa()
		case strings.HasPrefix(n, "cls.") || strings.HasPrefix(n, "lm_head."):
			return cfg.Head != HeadMaskedLM
		}
		return false
	}
	return models.LoadParams(dir, want, models.LoadOptions{Rename: rename, Ignore: ignore})
}

// checkpointNames returns the tensor names of the checkpoint in dir.
func checkpointNames(dir string) (map[string]bool, error) {
	c, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	out := map[string]bool{}
	for _, n := range c.Names() {
		out[n] = true
	}
	return out, nil
}

// Loss returns the mean loss of logits (Forward's) against labels, as transformers computes it: for a classifier,
// the cross entropy over labels [B] (int), or for a regression head the mean squared error of logits[:, 0]
// against labels [B] (float); for the masked LM, the cross entropy of every position against labels [B, T],
// positions labelled -100 left out.
func (m *Model) Loss(logits, labels *graph.Node) *graph.Node {
	if logits.DType().IsFloat() && logits.DType().Size() < 4 {
		logits = graph.ConvertDType(logits, dtypes.Float32)
	}
	switch {
	case m.Config.Regression():
		d := graph.Sub(graph.Reshape(logits, logits.Shape().Dim(0)), graph.ConvertDType(labels, dtypes.Float32))
		return graph.ReduceAllMean(graph.Mul(d, d))
	case m.Config.Head == HeadNone:
		panic("bert: the bare encoder has no loss (give it a head)")
	}
	return loss.CrossEntropy(logits, labels, loss.IgnoreIndex)
}
