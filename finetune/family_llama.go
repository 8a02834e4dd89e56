package finetune

// The LLaMA family: llama.Model as a trainable Model (causal LM or sequence classifier), its registration (loader,
// presets, planner shapes, random batches, generation config) and its data (Alpaca instructions, plain text,
// GLUE tasks).

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/tokenizer"
)

// llamaFamily is the LLaMA family's registration.
func llamaFamily() Family {
	return Family{
		Name:  "llama",
		Title: "LLaMA",
		Of:    func(m Model) bool { _, ok := m.(Llama); return ok },
		Load: func(dir string, opts ModelOptions) (Model, error) {
			m, err := llama.Load(dir, llamaOptions(opts))
			if err != nil {
				return nil, err
			}
			return Llama{Model: m}, nil
		},
		Rebuild: func(m Model, params models.Params, msNorm bool) (Model, error) {
			return m.(Llama).rebuild(params, msNorm)
		},
		RandomParams: func(m Model, seed uint64) models.Params {
			return llama.RandomParams(m.(Llama).Config, seed)
		},
		Shaped: func(dir string, opts ModelOptions) (Model, error) {
			c, err := llama.LoadConfig(dir)
			if err != nil {
				return nil, err
			}
			return Llama{Model: &llama.Model{Config: c, Options: llamaOptions(opts)}}, nil
		},
		Preset: func(name string, labels int, opts ModelOptions) (Model, error) {
			c, err := llama.Preset(name, labels)
			if err != nil {
				return nil, err
			}
			return Llama{Model: &llama.Model{Config: c, Options: llamaOptions(opts)}}, nil
		},
		Presets:  slices.Sorted(maps.Keys(llama.Presets)),
		Sequence: true,
		BatchShapes: func(m Model, in Shape) (map[string]shapes.Shape, error) {
			out := map[string]shapes.Shape{
				"input_ids":      shapes.Make(dtypes.Int32, in.Batch, in.Seq),
				"attention_mask": shapes.Make(dtypes.Int32, in.Batch, in.Seq),
				"labels":         shapes.Make(dtypes.Int32, in.Batch, in.Seq),
			}
			if m.(Llama).Config.Architecture == llama.ArchClassification {
				out["labels"] = shapes.Make(dtypes.Int32, in.Batch)
			} else if in.Packed {
				out["position_ids"] = shapes.Make(dtypes.Int32, in.Batch, in.Seq)
			}
			return out, nil
		},
		RandomBatch: func(m Model, in Shape, seed uint64) Batch {
			r := rand.New(rand.NewPCG(seed, 7))
			n := in.Batch * in.Seq
			ids := make([]int32, n)
			mask := make([]int32, n)
			for i := range ids {
				ids[i], mask[i] = int32(r.IntN(m.(Llama).Config.VocabSize)), 1
			}
			b := Batch{"input_ids": tensors.FromFlatDataAndDimensions(ids, in.Batch, in.Seq),
				"attention_mask": tensors.FromFlatDataAndDimensions(mask, in.Batch, in.Seq),
				"labels":         tensors.FromFlatDataAndDimensions(append([]int32(nil), ids...), in.Batch, in.Seq)}
			if in.Packed && m.(Llama).Config.Architecture != llama.ArchClassification {
				// Documents of random lengths from 1 to the sequence, positions restarting at each.
				pos := make([]int32, n)
				for row := 0; row < in.Batch; row++ {
					p, doc := 0, 1+r.IntN(in.Seq)
					for t := 0; t < in.Seq; t++ {
						if p == doc {
							p, doc = 0, 1+r.IntN(in.Seq)
						}
						pos[row*in.Seq+t] = int32(p)
						p++
					}
				}
				b["position_ids"] = tensors.FromFlatDataAndDimensions(pos, in.Batch, in.Seq)
			}
			return b
		},
		Formats:        []string{FormatAlpaca, FormatMessages, FormatText, FormatGLUE},
		OpenData:       openText,
		WrongModel:     func(string) error { return fmt.Errorf("text data needs a LLaMA model") },
		CheckTokenizer: checkLlamaTokenizer,
		GenerationConfig: func(m Model) map[string]any {
			c := m.(Llama).Config
			if c.Architecture != llama.ArchCausalLM {
				return nil
			}
			gen := map[string]any{"_from_model_config": true}
			for key, id := range map[string]int{"bos_token_id": c.BOSTokenID, "eos_token_id": c.EOSTokenID, "pad_token_id": c.PadTokenID} {
				if id >= 0 {
					gen[key] = id
				}
			}
			return gen
		},
		Cut: func(m Model, blocks int) Model {
			l := m.(Llama)
			c := l.Config
			c.NumHiddenLayers = min(blocks, c.NumHiddenLayers)
			c.VocabSize = min(c.VocabSize, calibrationVocab)
			for _, id := range []*int{&c.PadTokenID, &c.BOSTokenID, &c.EOSTokenID} {
				if *id >= c.VocabSize {
					*id = -1
				}
			}
			c.EOSTokenIDs = slices.DeleteFunc(slices.Clone(c.EOSTokenIDs), func(id int) bool { return id >= c.VocabSize })
			opts := l.Options
			opts.Blocks = nil // the per-block plan is set afterwards, for the cut's blocks
			return Llama{Model: &llama.Model{Config: c, Options: opts}}
		},
		BlockFLOPs: func(m Model, in Shape) float64 {
			c := m.(Llama).Config
			h, q, kv := float64(c.HiddenSize), float64(c.NumAttentionHeads*c.HeadDim), float64(c.NumKeyValueHeads*c.HeadDim)
			tokens, seq := float64(in.Batch*in.Seq), float64(in.Seq)
			linear := h*q + 2*h*kv + q*h + 3*h*float64(c.IntermediateSize) // q, k, v, o; gate, up, down
			return 2*tokens*linear + 4*tokens*seq*q                        // QK^T and AV over the whole sequence
		},
	}
}

// calibrationVocab is the vocabulary of a LLaMA cut for the autopilot's calibration (Family.Cut): the embedding
// and the head are outside the blocks, so their size changes no block's time, only the calibration's.
const calibrationVocab = 256

// llamaOptions are a LLaMA's options in the modes of opts.
func llamaOptions(opts ModelOptions) llama.Options {
	return llama.Options{ApproxActivation: opts.ApproxAct, MSNorm: opts.MSNorm, GradCheckpoint: opts.GradCkpt, Attention: opts.Attention}
}

// openText opens text data (FormatAlpaca, FormatMessages, FormatText, FormatGLUE) for the LLaMA m (TextExamples), its notes in
// the loader's Notes.
func openText(src DataSource) (Iterator, error) {
	ex, notes, chat, err := textExamples(src.Path, src.Options, src.Model, src.ModelDir)
	if err != nil {
		return nil, err
	}
	l, err := NewLoader(ex, src.BatchSize, src.Seed, true)
	if err != nil {
		return nil, err
	}
	l.Notes, l.ChatTemplate = notes, chat
	return l, nil
}

// Llama adapts a llama.Model: causal language modelling (next-token cross entropy, labels [B, T] with -100 for
// positions to skip, shifted by one inside the loss) or sequence classification (labels [B]), given
// "input_ids" and "attention_mask" [B, T].
type Llama struct{ *llama.Model }

// Params returns the model's graph parameters.
func (m Llama) Params() models.Params { return m.Model.Params }

// LinearLayers returns the LLaMA's linear layers.
func (m Llama) LinearLayers() []models.LinearLayer { return llama.LinearLayers(m.Config) }

// BatchInputs returns attention_mask, input_ids and labels.
func (m Llama) BatchInputs() []string { return []string{"attention_mask", "input_ids", "labels"} }

// Logits returns the logits: [B, T, vocab] for the causal LM, [B, labels] for the classifier.
// A batch of packed sequences also has position_ids [B, T] (data.PackExamples): the model then restarts
// positions and keeps attention within each packed example (llama.Model.ForwardPacked).
func (m Llama) Logits(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	return m.ForwardPacked(b, batch["input_ids"], batch["attention_mask"], batch["position_ids"]).Logits
}

// Folds lists the model's MS-RMSNorm folds.
func (m Llama) Folds() []models.Fold { return llama.Folds(m.Config) }

// Task returns CAUSAL_LM or SEQ_CLS.
func (m Llama) Task() string {
	if m.Config.Architecture == llama.ArchClassification {
		return "SEQ_CLS"
	}
	return "CAUSAL_LM"
}

// Shapes returns the checkpoint's parameter shapes.
func (m Llama) Shapes() map[string][]int { return llama.Shapes(m.Config) }

// Loss is the next-token cross entropy (causal LM) or the classification cross entropy.
func (m Llama) Loss(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	logits := toF32(m.Logits(b, batch))
	labels := batch["labels"]
	if m.Config.Architecture == llama.ArchClassification {
		if len(m.Config.Labels) == 1 { // regression (as transformers with num_labels 1): mean squared error
			d := graph.Sub(graph.Reshape(logits, logits.Shape().Dim(0)), graph.ConvertDType(labels, dtypes.Float32))
			return graph.ReduceAllMean(graph.Mul(d, d))
		}
		return loss.CrossEntropy(logits, labels, loss.IgnoreIndex)
	}
	n := logits.Shape().Dim(1)
	return loss.CrossEntropy(engine.SliceAxis(logits, 1, 0, n-1), engine.SliceAxis(labels, 1, 1, n), loss.IgnoreIndex)
}

// Folded returns the norm tensors removed by folding.
func (m Llama) Folded() models.Params { return m.Model.Folded }

// ConfigJSON returns the model's config.json.
func (m Llama) ConfigJSON() ([]byte, error) { return m.Config.JSON() }

// BlockModes returns the LLaMA's per-block plan and its number of decoder layers.
func (m Llama) BlockModes() ([]models.BlockMode, int) {
	return m.Options.Blocks, m.Config.NumHiddenLayers
}

// SetBlockModes sets the LLaMA's per-block plan.
func (m Llama) SetBlockModes(modes []models.BlockMode) { m.Options.Blocks = modes }

// GradCheckpoint reports the LLaMA's model-wide gradient checkpointing.
func (m Llama) GradCheckpoint() bool { return m.Options.GradCheckpoint }

func (m Llama) rebuild(params models.Params, msNorm bool) (Model, error) {
	opts := m.Options
	opts.MSNorm = msNorm
	l, err := llama.New(m.Config, params, opts)
	return Llama{Model: l}, err
}

// CheckBatch checks a LLaMA batch: input_ids within the vocabulary and at most max_position_embeddings long,
// attention_mask of 0 and 1, and labels within the vocabulary or -100 (causal LM) or within the classes
// (sequence classification).
func (m Llama) CheckBatch(b Batch) error {
	c := m.Config
	if ids, ok := b["input_ids"]; ok {
		if ids.Rank() != 2 {
			return fmt.Errorf("input_ids has shape %v; the model takes [batch, sequence]", ids.Shape().Dimensions)
		}
		if n := ids.Shape().Dim(1); n > c.MaxPositionEmbeddings {
			return fmt.Errorf("sequences of %d tokens are longer than the model's %d positions (max_position_embeddings): lower the sequence length", n, c.MaxPositionEmbeddings)
		}
		if err := checkRange(ids, "input_ids", 0, c.VocabSize, false, fmt.Sprintf(
			"the model's vocabulary has %d tokens (vocab_size): the tokenizer does not belong to this model", c.VocabSize)); err != nil {
			return err
		}
	}
	if mask, ok := b["attention_mask"]; ok {
		if err := checkRange(mask, "attention_mask", 0, 2, false, "a mask holds 0 (padding) or 1"); err != nil {
			return err
		}
	}
	if pos, ok := b["position_ids"]; ok {
		if c.Architecture == llama.ArchClassification {
			return fmt.Errorf("position_ids: packed sequences are for the causal LM, the model is a sequence classifier")
		}
		if ids, ok := b["input_ids"]; ok && fmt.Sprint(pos.Shape().Dimensions) != fmt.Sprint(ids.Shape().Dimensions) {
			return fmt.Errorf("position_ids has shape %v, input_ids %v: they go together", pos.Shape().Dimensions, ids.Shape().Dimensions)
		}
		if pos.Rank() == 2 {
			if err := checkRange(pos, "position_ids", 0, pos.Shape().Dim(1), false, "a packed example's positions count from 0 within the sequence"); err != nil {
				return err
			}
		}
	}
	if l, ok := b["labels"]; ok {
		if c.Architecture == llama.ArchClassification {
			return checkRange(l, "labels", 0, len(c.Labels), false, fmt.Sprintf("the model has %d classes (num_labels)", len(c.Labels)))
		}
		return checkRange(l, "labels", 0, c.VocabSize, true, fmt.Sprintf(
			"the model's vocabulary has %d tokens (vocab_size), and -100 leaves a position out", c.VocabSize))
	}
	return nil
}

// checkLlamaTokenizer refuses a tokenizer with more tokens than the model's vocabulary: its ids would index past the
// embedding table.
func checkLlamaTokenizer(tok *tokenizer.Tokenizer, model Model) error {
	m := model.(Llama)
	if n := tok.VocabSize(); n > m.Config.VocabSize {
		return fmt.Errorf("the tokenizer has %d tokens but the model's vocabulary has %d (vocab_size): they do not belong together; use the model's own tokenizer", n, m.Config.VocabSize)
	}
	return nil
}

// HasTargets reports whether a causal-LM batch has a token to learn: a label other than -100 at positions 1 and
// on (position 0 predicts nothing). A batch without one gives loss 0 and a zero gradient, yet an optimizer step on
// it would still move the weights (AdamW's moments, weight decay): Fit skips it and counts it. Classification
// batches always have targets.
func (m Llama) HasTargets(b Batch) bool {
	l, ok := b["labels"]
	if !ok || m.Config.Architecture == llama.ArchClassification || l.Rank() != 2 {
		return true
	}
	if dt := l.DType(); dt != dtypes.Int32 && dt != dtypes.Int64 {
		return true // FindInt reads int32 and int64 labels; others are not judged
	}
	n := l.Shape().Dim(1)
	return models.FindInt(l, func(i int, v int64) bool { return i%n > 0 && v != loss.IgnoreIndex }) >= 0
}

// hasTarget reports whether a label sequence has a token the loss learns from: one not ignored, after the first
// position (a causal LM predicts token t from the tokens before it).
func hasTarget(labels []int) bool {
	for i, l := range labels {
		if i > 0 && l != loss.IgnoreIndex {
			return true
		}
	}
	return false
}

// TextExamples reads text data for a LLaMA model: Alpaca instructions (prompt masked), plain text packed into
// SeqLen blocks, or a GLUE task's split as sequence classification (pairs joined by the tokenizer's pair
// template, or by a newline when it has none).
//
// Alpaca examples longer than the sequence length are cut on the right; one whose response is cut off entirely
// (no target token left) would only add steps with no gradient, so it is left out. OpenData's loader reports
// both counts in its Notes.
func TextExamples(path string, opts DataOptions, model Model, modelDir string) (Examples, error) {
	ex, _, _, err := textExamples(path, opts, model, modelDir)
	return ex, err
}

// textExamples is TextExamples with its notes and, for conversations, the chat template they took.
func textExamples(path string, opts DataOptions, model Model, modelDir string) (Examples, []string, string, error) {
	var notes []string
	chat := ""
	ex, err := textExamplesNoted(path, opts, model, modelDir, func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }, &chat)
	return ex, notes, chat, err
}

func textExamplesNoted(path string, opts DataOptions, model Model, modelDir string, note func(string, ...any), chat *string) (Examples, error) {
	m, ok := model.(Llama)
	if !ok {
		return nil, fmt.Errorf("text data needs a LLaMA model")
	}
	tokPath := opts.Tokenizer
	if tokPath == "" {
		tokPath = modelDir
	}
	tok, err := tokenizer.Load(tokPath)
	if err != nil {
		return nil, fmt.Errorf("text data needs a tokenizer (--tokenizer, or tokenizer files in the model folder): %w", err)
	}
	if err := CheckTokenizer(tok, model); err != nil {
		return nil, fmt.Errorf("%s: %w", tokPath, err)
	}
	seqLen := opts.SeqLen
	if seqLen == 0 {
		seqLen = min(256, m.Config.MaxPositionEmbeddings)
	}
	if seqLen < 2 || seqLen > m.Config.MaxPositionEmbeddings {
		return nil, fmt.Errorf("--seq-len %d: a sequence needs 2 to %d tokens (the model's max_position_embeddings)", seqLen, m.Config.MaxPositionEmbeddings)
	}
	pad, ok := tok.Pad()
	if !ok {
		pad = max(0, m.Config.PadTokenID)
	}
	classifier := m.Config.Architecture == llama.ArchClassification
	format := DataFormat(path, opts)
	switch {
	case format == FormatParquet: // read as the format its columns stand for (data_parquet.go)
		if format, err = parquetTextFormat(path, opts, classifier, note); err != nil {
			return nil, err
		}
	case format == FormatAlpaca && opts.Format == "":
		// .jsonl: Alpaca rows or conversations, as the file's first row says.
		kind, err := data.JSONLKind(path)
		if err != nil {
			return nil, err
		}
		if kind == data.KindMessages {
			format = FormatMessages
		}
	}
	if opts.Packing && format != FormatAlpaca && format != FormatMessages {
		return nil, fmt.Errorf("--packing packs instruction and conversation examples (alpaca, messages data), not %s data: leave it out", format)
	}
	if opts.ChatTemplate != "" && format != FormatMessages {
		return nil, fmt.Errorf("--chat-template renders conversations (messages data); %s is %s data: leave it out", path, format)
	}
	if classifier != (format == FormatGLUE) {
		if format == FormatGLUE {
			labels := 2
			if info, err := data.GLUETask(opts.Task); err == nil && info.Regression {
				labels = 1
			}
			return nil, fmt.Errorf("%s is GLUE %s data, which trains a sequence classifier, but the model is a causal LM (%s): give it a classification head with finetune init --from %s --num-labels %d --out NEW",
				path, opts.Task, m.Config.Architecture, modelDir, labels)
		}
		return nil, fmt.Errorf("%s data needs a causal-LM model, the model is %s", format, m.Config.Architecture)
	}
	var ex map[string]*tensors.Tensor
	switch format {
	case FormatAlpaca:
		rows, err := readInstructions(path, opts)
		if err != nil {
			return nil, err
		}
		if rows, err = withoutEmptyReplies(path, rows, data.Instruction.EmptyReply, note); err != nil {
			return nil, err
		}
		var ids, labels [][]int
		for _, r := range rows {
			id, label := tok.FormatInstruction(r.Instruction, r.Input, r.Output)
			ids, labels = append(ids, id), append(labels, label)
		}
		if ex, err = supervisedExamples(path, ids, labels, seqLen, pad, opts.Packing, note); err != nil {
			return nil, err
		}
	case FormatMessages:
		ids, labels, err := conversationTokens(path, opts, tok, note, chat)
		if err != nil {
			return nil, err
		}
		if ex, err = supervisedExamples(path, ids, labels, seqLen, pad, opts.Packing, note); err != nil {
			return nil, err
		}
	case FormatText:
		docs, err := readDocuments(path, opts)
		if err != nil {
			return nil, err
		}
		eos, _ := tok.EOS()
		var seqs [][]int
		for _, d := range docs {
			seqs = append(seqs, tok.Encode(d, false))
		}
		blocks := data.Pack(seqs, eos, seqLen)
		if len(blocks) == 0 {
			return nil, fmt.Errorf("%s has fewer than %d tokens", path, seqLen)
		}
		if ex, err = data.TokenExamples(blocks, nil, seqLen, pad); err != nil {
			return nil, err
		}
	case FormatGLUE:
		split := opts.Split
		if split == "" {
			split = "train"
		}
		info, err := data.GLUETask(opts.Task)
		if err != nil {
			return nil, err
		}
		want := len(info.Classes)
		if info.Regression {
			want = 1
		}
		if len(m.Config.Labels) != want {
			return nil, fmt.Errorf("GLUE %s has %d labels but the model has %d", opts.Task, want, len(m.Config.Labels))
		}
		if m.Config.PadTokenID != pad {
			return nil, fmt.Errorf("the model's pad_token_id %d differs from the tokenizer's padding id %d: the classifier would pool the wrong token", m.Config.PadTokenID, pad)
		}
		rows, err := readGLUE(path, opts, split)
		if err != nil {
			return nil, err
		}
		ids, classes := make([][]int, len(rows)), make([]int, len(rows))
		var scores []float32
		for i, r := range rows {
			ids[i] = GLUEIDs(tok, r)
			ids[i] = tokenizer.Truncate(ids[i], seqLen, tokenizer.Right)
			classes[i] = r.Label
			if info.Regression {
				scores = append(scores, float32(r.Score))
			}
		}
		if ex, err = data.ClassExamples(ids, classes, scores, seqLen, pad); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%q is not a text format", format)
	}
	return Examples(ex), nil
}

// GLUEIDs encodes a GLUE example for sequence classification: r.TokenIDs(tok) (one sentence, or a pair with
// the tokenizer's pair template).
func GLUEIDs(tok *tokenizer.Tokenizer, r data.GLUEExample) []int { return r.TokenIDs(tok) }
