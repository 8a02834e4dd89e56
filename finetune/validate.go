package finetune

import (
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/tokenizer"
)

// Checking inputs against the model before anything is computed: an out-of-range token id or label would
// otherwise be a silent wrong result (a gather clamps it) or a crash deep in the backend.

// checkRange is models.CheckRange, with -100 (ignore) allowed when ignore is set.
func checkRange(t *tensors.Tensor, name string, lo, hi int, ignore bool, why string) error {
	if ignore {
		return models.CheckRange(t, name, lo, hi, why, loss.IgnoreIndex)
	}
	return models.CheckRange(t, name, lo, hi, why)
}

// targetChecker is a model that can tell a batch with nothing to learn (Llama.HasTargets).
type targetChecker interface {
	HasTargets(b Batch) bool
}

// CheckTokenizer refuses a tokenizer that does not belong to model (its family's check: a LLaMA's vocabulary
// must hold every token id), so that its ids never index past the embedding table.
func CheckTokenizer(tok *tokenizer.Tokenizer, model Model) error {
	fam, ok := FamilyOf(model)
	if !ok || fam.CheckTokenizer == nil {
		return nil
	}
	return fam.CheckTokenizer(tok, model)
}

// CheckTrainable refuses a model that cannot be fine-tuned as it is (its family's check: a bare ViTModel has no
// head, ErrNoHead).
func CheckTrainable(model Model) error {
	fam, ok := FamilyOf(model)
	if !ok || fam.Trainable == nil {
		return nil
	}
	return fam.Trainable(model)
}
