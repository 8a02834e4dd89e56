// Package bert is the encoder family: BERT, RoBERTa and XLM-RoBERTa (model_type "bert", "roberta", "xlm-roberta")
// on the shared post-LN encoder graph (models/encoder), registered with finetune from this package's init: loading,
// presets (roberta-base, bert-base), the memory planner's shapes and cost model, random batches, GLUE data
// encoded as each model expects (RoBERTa's <s> A </s></s> B </s>, BERT's [CLS] A [SEP] B [SEP] with token type
// ids) and masked-LM pretraining data. A program that trains encoders imports it for that side effect.
package bert

import (
	"fmt"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/encoder"
	"github.com/memfit/memfit/tokenizer"
)

// Encoder adapts an encoder.Model to finetune.Model: sequence classification (labels [B] int, or float scores
// for a regression head) or masked-LM pretraining (labels [B, T], -100 where nothing is predicted), given
// input_ids and attention_mask [B, T] and, for BERT (type_vocab_size above 1), token_type_ids [B, T].
type Encoder struct{ *encoder.Model }

// Params returns the model's graph parameters.
func (m Encoder) Params() models.Params { return m.Model.Params }

// LinearLayers returns the encoder's linear layers.
func (m Encoder) LinearLayers() []models.LinearLayer { return encoder.LinearLayers(m.Config) }

// TokenTypes reports whether the model's batches carry token_type_ids (BERT's segment embeddings; RoBERTa's
// single type takes none, as its tokenizer gives none).
func (m Encoder) TokenTypes() bool { return m.Config.TypeVocabSize > 1 }

// BatchInputs returns attention_mask, input_ids, labels and, with token types, token_type_ids.
func (m Encoder) BatchInputs() []string {
	if m.TokenTypes() {
		return []string{"attention_mask", "input_ids", "labels", "token_type_ids"}
	}
	return []string{"attention_mask", "input_ids", "labels"}
}

// Logits returns the classifier's logits [B, labels] (regression [B, 1]) or the masked LM's [B, T, vocab].
func (m Encoder) Logits(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	var types *graph.Node
	if m.TokenTypes() {
		types = batch["token_type_ids"]
	}
	return m.Forward(b, batch["input_ids"], batch["attention_mask"], types).Logits
}

// Loss is the classification cross entropy, the regression's mean squared error, or the masked LM's cross
// entropy over the labelled positions.
func (m Encoder) Loss(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	if m.Config.Head == encoder.HeadNone {
		panic(fmt.Errorf("finetune: a bare %s has no head to train", m.Config.Architecture))
	}
	return m.Model.Loss(m.Logits(b, batch), batch["labels"])
}

// Folds lists the model's MS-LN folds.
func (m Encoder) Folds() []models.Fold { return encoder.Folds(m.Config) }

// Task returns PEFT's task type: SEQ_CLS for a classifier, FEATURE_EXTRACTION for the bare encoder, none for the
// masked LM (PEFT has no masked-LM task type).
func (m Encoder) Task() string {
	switch m.Config.Head {
	case encoder.HeadClassification:
		return "SEQ_CLS"
	case encoder.HeadNone:
		return "FEATURE_EXTRACTION"
	}
	return ""
}

// Shapes returns the checkpoint's parameter shapes.
func (m Encoder) Shapes() map[string][]int { return encoder.Shapes(m.Config) }

// Folded returns the folded norms' tensors.
func (m Encoder) Folded() models.Params { return m.Model.Folded }

// ConfigJSON returns the model's config.json.
func (m Encoder) ConfigJSON() ([]byte, error) { return m.Config.JSON() }

// BlockModes returns the per-block plan and the number of encoder layers.
func (m Encoder) BlockModes() ([]models.BlockMode, int) {
	return m.Options.Blocks, m.Config.NumHiddenLayers
}

// SetBlockModes sets the per-block plan.
func (m Encoder) SetBlockModes(modes []models.BlockMode) { m.Options.Blocks = modes }

// GradCheckpoint reports the model-wide gradient checkpointing.
func (m Encoder) GradCheckpoint() bool { return m.Options.GradCheckpoint }

// CheckBatch checks a batch against the model: input_ids within the vocabulary and no longer than the position
// embeddings take, attention_mask of 0 and 1, token_type_ids within type_vocab_size, labels within the classes
// (classification), or within the vocabulary or -100 (masked LM).
func (m Encoder) CheckBatch(b finetune.Batch) error {
	c := m.Config
	if err := finetune.CheckTokenInputs(b, c.VocabSize, c.MaxSequence(), fmt.Sprintf("max_position_embeddings %d", c.MaxPositionEmbeddings)); err != nil {
		return err
	}
	if tt, ok := b["token_type_ids"]; ok {
		if err := models.CheckRange(tt, "token_type_ids", 0, c.TypeVocabSize, fmt.Sprintf("the model has %d token types (type_vocab_size)", c.TypeVocabSize)); err != nil {
			return err
		}
	}
	l, ok := b["labels"]
	switch {
	case !ok:
	case c.Regression():
		if !l.DType().IsFloat() || l.Rank() != 1 {
			return fmt.Errorf("labels are %s: a regression head takes one float score per example", l.Shape())
		}
	case c.Head == encoder.HeadClassification:
		if l.Rank() != 1 {
			return fmt.Errorf("labels have shape %v: a classifier takes one class per example", l.Shape().Dimensions)
		}
		return models.CheckRange(l, "labels", 0, len(c.Labels), fmt.Sprintf("the model has %d classes (num_labels)", len(c.Labels)))
	case c.Head == encoder.HeadMaskedLM:
		return models.CheckRange(l, "labels", 0, c.VocabSize, fmt.Sprintf("the model's vocabulary has %d tokens (vocab_size), and -100 leaves a position out", c.VocabSize), loss.IgnoreIndex)
	}
	return nil
}

// HasTargets reports whether a masked-LM batch has a position to predict (a label other than -100); a batch
// without one gives loss 0 and would still move the weights through the optimizer, so training skips it.
// Classification batches always have targets.
func (m Encoder) HasTargets(b finetune.Batch) bool {
	l, ok := b["labels"]
	if !ok || m.Config.Head != encoder.HeadMaskedLM {
		return true
	}
	if dt := l.DType(); dt != dtypes.Int32 && dt != dtypes.Int64 {
		return true
	}
	return models.FindInt(l, func(_ int, v int64) bool { return v != loss.IgnoreIndex }) >= 0
}

// rebuild builds the model again over params in its own options, folding when msNorm.
func (m Encoder) rebuild(params models.Params, msNorm bool) (finetune.Model, error) {
	opts := m.Options
	opts.MSNorm = msNorm
	e, err := encoder.New(m.Config, params, opts)
	if err != nil {
		return nil, err
	}
	return Encoder{Model: e}, nil
}

// TextSpec describes the encoder to the code that feeds it text (tokenizer checks, GLUE evaluation, --seq-len
// checks): its vocabulary, the longest sequence its positions take (RoBERTa's padding_idx + 1 offset
// subtracted), its special ids, PEFT's task (SEQ_CLS for a classifier) and its classes.
func (m Encoder) TextSpec() models.TextSpec {
	c := m.Config
	s := models.TextSpec{VocabSize: c.VocabSize, MaxPositions: c.MaxSequence(), PadID: c.PadTokenID, BOSID: c.BOSTokenID, Task: m.Task(), Labels: c.Labels}
	if c.EOSTokenID >= 0 {
		s.EOSIDs = []int{c.EOSTokenID}
	}
	return s
}

// GLUEInputs encodes GLUE examples as the encoder reads them (evals.GLUEEncoder): each sentence or pair with the
// tokenizer's template and token type ids, truncated to seqLen as transformers' truncation=True does, padded
// with the model's pad id; token_type_ids only for BERT.
func (m Encoder) GLUEInputs(tok *tokenizer.Tokenizer, examples []data.GLUEExample, seqLen int) (finetune.Batch, error) {
	encs := make([]tokenizer.Encoding, len(examples))
	for i, e := range examples {
		encs[i] = e.Inputs(tok, seqLen)
	}
	ex, err := data.EncoderExamples(encs, nil, nil, seqLen, padID(m.Config, tok), m.TokenTypes())
	return finetune.Batch(ex), err
}
