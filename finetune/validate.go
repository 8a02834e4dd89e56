package finetune

import (
	"errors"
	"fmt"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/tokenizer"
)

// Checking inputs against the model before anything is computed: an out-of-range token id or label would
// otherwise be a silent wrong result (a gather clamps it) or a crash deep in the backend.

// CheckBatch checks a ViT batch: pixel_values [B, channels, H, W] with the model's channels, and labels [B]
// class indices within the model's classes.
func (m ViT) CheckBatch(b Batch) error {
	if px, ok := b["pixel_values"]; ok {
		if px.Rank() != 4 || px.Shape().Dim(1) != m.Config.NumChannels {
			return fmt.Errorf("pixel_values has shape %v; the model takes [batch, %d, height, width]", px.Shape().Dimensions, m.Config.NumChannels)
		}
		if h, w := px.Shape().Dim(2), px.Shape().Dim(3); h != m.Config.ImageSize || w != m.Config.ImageSize {
			return fmt.Errorf("pixel_values are %dx%d images but the model takes %dx%d (image_size in its config.json): resize them (image folders and tars are resized by the model's preprocessor)", h, w, m.Config.ImageSize, m.Config.ImageSize)
		}
		if !px.DType().IsFloat() {
			return fmt.Errorf("pixel_values are %s; the model takes floating-point pixels (float32, normalized as its preprocessor_config.json says)", px.DType())
		}
	}
	if l, ok := b["labels"]; ok {
		if len(m.Config.Labels) == 0 {
			return fmt.Errorf("the batch has labels but the model has no classification head (ViTModel)")
		}
		return checkRange(l, "labels", 0, len(m.Config.Labels), false,
			fmt.Sprintf("the model has %d classes (num_labels in its config.json)", len(m.Config.Labels)))
	}
	return nil
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
	if l, ok := b["labels"]; ok {
		if c.Architecture == llama.ArchClassification {
			return checkRange(l, "labels", 0, len(c.Labels), false, fmt.Sprintf("the model has %d classes (num_labels)", len(c.Labels)))
		}
		return checkRange(l, "labels", 0, c.VocabSize, true, fmt.Sprintf(
			"the model's vocabulary has %d tokens (vocab_size), and -100 leaves a position out", c.VocabSize))
	}
	return nil
}

// checkRange is models.CheckRange, with -100 (ignore) allowed when ignore is set.
func checkRange(t *tensors.Tensor, name string, lo, hi int, ignore bool, why string) error {
	if ignore {
		return models.CheckRange(t, name, lo, hi, why, loss.IgnoreIndex)
	}
	return models.CheckRange(t, name, lo, hi, why)
}

// CheckTokenizer refuses a tokenizer with more tokens than the model's vocabulary: its ids would index past the
// embedding table.
func CheckTokenizer(tok *tokenizer.Tokenizer, model Model) error {
	m, ok := model.(Llama)
	if !ok {
		return nil
	}
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

// targetChecker is a model that can tell a batch with nothing to learn (Llama.HasTargets).
type targetChecker interface {
	HasTargets(b Batch) bool
}

// ErrNoHead is returned when a bare ViTModel (no classification head) is to be trained: it has no loss.
var ErrNoHead = errors.New("the model is a bare ViTModel with no classification head, so it has no loss to train")

// CheckTrainable refuses a model that cannot be fine-tuned as it is (a bare ViTModel: ErrNoHead).
func CheckTrainable(model Model) error {
	if v, ok := model.(ViT); ok && len(v.Config.Labels) == 0 {
		return fmt.Errorf("%w: give it one (finetune init --from MODEL --num-labels N; finetune memory --num-labels N)", ErrNoHead)
	}
	return nil
}
