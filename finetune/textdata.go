package finetune

// Text data for models over token ids (models.TextModel: every decoder family, and text encoders): Alpaca
// instructions, conversations, plain text and GLUE tasks, read as the model's TextSpec says (its positions, pad
// id, task and classes). A family whose models take text lists TextFormats in Family.Formats and OpenText as its
// OpenData.

import (
	"fmt"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/tokenizer"
)

// TextFormats are the data formats OpenText reads.
var TextFormats = []string{FormatAlpaca, FormatMessages, FormatText, FormatGLUE}

// OpenText opens text data (TextFormats) for a text model (TextExamples), its notes in the loader's Notes: a
// family's OpenData.
func OpenText(src DataSource) (Iterator, error) {
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

// TextExamples reads text data for a text model (models.TextModel): Alpaca instructions (prompt masked), plain text packed into
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

// CheckTokenInputs checks a text batch's input_ids ([batch, sequence], within the vocabulary, at most positions
// long) and attention_mask (0 and 1) against a model of vocab tokens; positionsWhy names where the positions come
// from in the message ("max_position_embeddings").
func CheckTokenInputs(b Batch, vocab, positions int, positionsWhy string) error {
	if ids, ok := b["input_ids"]; ok {
		if ids.Rank() != 2 {
			return fmt.Errorf("input_ids has shape %v; the model takes [batch, sequence]", ids.Shape().Dimensions)
		}
		if n := ids.Shape().Dim(1); n > positions {
			return fmt.Errorf("sequences of %d tokens are longer than the model's %d positions (%s): lower the sequence length", n, positions, positionsWhy)
		}
		if err := models.CheckRange(ids, "input_ids", 0, vocab, fmt.Sprintf(
			"the model's vocabulary has %d tokens (vocab_size): the tokenizer does not belong to this model", vocab)); err != nil {
			return err
		}
	}
	if mask, ok := b["attention_mask"]; ok {
		return models.CheckRange(mask, "attention_mask", 0, 2, "a mask holds 0 (padding) or 1")
	}
	return nil
}

// LoadTextTokenizer reads the tokenizer of text data for model (opts.Tokenizer, else the model folder's) and checks
// that it belongs to the model (its family's CheckTokenizer); it returns the path it read too. Errors name it.
func LoadTextTokenizer(opts DataOptions, modelDir string, model Model) (*tokenizer.Tokenizer, string, error) {
	return loadTokenizer(opts, modelDir, model, "text data")
}

// loadTokenizer is LoadTextTokenizer for data that what names in its message.
func loadTokenizer(opts DataOptions, modelDir string, model Model, what string) (*tokenizer.Tokenizer, string, error) {
	path := opts.Tokenizer
	if path == "" {
		path = modelDir
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		return nil, path, fmt.Errorf("%s needs a tokenizer (--tokenizer, or tokenizer files in the model folder): %w", what, err)
	}
	if err := CheckTokenizer(tok, model); err != nil {
		return nil, path, fmt.Errorf("%s: %w", path, err)
	}
	return tok, path, nil
}

func textExamplesNoted(path string, opts DataOptions, model Model, modelDir string, note func(string, ...any), chat *string) (Examples, error) {
	tm, ok := model.(models.TextModel)
	if !ok {
		return nil, fmt.Errorf("text data needs a model over token ids; %s", familyTitle(model))
	}
	spec := tm.TextSpec()
	tok, seqLen, err := textTokenizer(opts, model, spec, modelDir, "text data")
	if err != nil {
		return nil, err
	}
	pad, ok := tok.Pad()
	if !ok {
		pad = max(0, spec.PadID)
	}
	classifier := !spec.CausalLM()
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
			return nil, fmt.Errorf("%s is GLUE %s data, which trains a sequence classifier, but the model is a causal LM: give it a classification head with finetune init --from %s --num-labels %d --out NEW",
				path, opts.Task, modelDir, labels)
		}
		return nil, fmt.Errorf("%s data needs a causal-LM model, the model is a sequence classifier", format)
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
		if len(spec.Labels) != want {
			return nil, fmt.Errorf("GLUE %s has %d labels but the model has %d", opts.Task, want, len(spec.Labels))
		}
		if spec.PadID != pad {
			return nil, fmt.Errorf("the model's pad_token_id %d differs from the tokenizer's padding id %d: the classifier would pool the wrong token", spec.PadID, pad)
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

// CheckTextTokenizer refuses a tokenizer with more tokens than a text model's vocabulary: its ids would index
// past the embedding table (a family's CheckTokenizer).
func CheckTextTokenizer(tok *tokenizer.Tokenizer, model Model) error {
	m, ok := model.(models.TextModel)
	if !ok {
		return fmt.Errorf("model %T takes no text", model)
	}
	if n, vocab := tok.VocabSize(), m.TextSpec().VocabSize; n > vocab {
		return fmt.Errorf("the tokenizer has %d tokens but the model's vocabulary has %d (vocab_size): they do not belong together; use the model's own tokenizer", n, vocab)
	}
	return nil
}

// textTokenizer loads the tokenizer of text data for model (opts.Tokenizer, else the model folder's), checks it
// against the model, and returns it with the sequence length (opts.SeqLen; default 256, at most the model's
// positions). what names the data in the errors.
func textTokenizer(opts DataOptions, model Model, spec models.TextSpec, modelDir, what string) (*tokenizer.Tokenizer, int, error) {
	tok, _, err := loadTokenizer(opts, modelDir, model, what)
	if err != nil {
		return nil, 0, err
	}
	seqLen := opts.SeqLen
	if seqLen == 0 {
		seqLen = min(256, spec.MaxPositions)
	}
	if seqLen < 2 || seqLen > spec.MaxPositions {
		return nil, 0, fmt.Errorf("--seq-len %d: a sequence needs 2 to %d tokens (the model's max_position_embeddings)", seqLen, spec.MaxPositions)
	}
	return tok, seqLen, nil
}
