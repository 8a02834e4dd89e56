package finetune

import (
	"fmt"
	"math"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/runner"
)

// Validation while training: Fit evaluates Trainer.Validation (an EvalSet: a separate dataset, or a hold-out of
// the training data) every Config.EvalEvery steps and at the last step, over the whole set; logs an "eval" record
// to the metrics; keeps the checkpoint of the lowest validation loss in the output folder's BestDir; and stops
// after Config.EarlyStoppingPatience evaluations without improvement. EvalState, saved in every checkpoint,
// makes a resumed run continue all of it exactly.

// BestDir is the folder in a run's output folder that holds the checkpoint of the lowest validation loss; it is
// never pruned (Config.KeepCheckpoints counts checkpoint-N folders only).
const BestDir = "best"

// EvalSet is a validation set that can be read whole, in order, in batches.
type EvalSet interface {
	// Len is the number of examples.
	Len() int
	// Batches calls fn on consecutive batches of at most size examples (the last may be shorter), each with the
	// index of its first example.
	Batches(size int, fn func(b Batch, first int) error) error
}

// ExamplesEval is an in-memory validation set.
type ExamplesEval struct{ Examples }

// Batches calls fn on consecutive slices of the examples.
func (e ExamplesEval) Batches(size int, fn func(Batch, int) error) error {
	return consecutiveBatches(e.Examples.Len(), size, func(idx []int) (Batch, error) {
		b := Batch{}
		for name, t := range e.Examples {
			g, err := gatherRows(t, idx)
			if err != nil {
				return nil, err
			}
			b[name] = g
		}
		return b, nil
	}, fn)
}

// consecutiveBatches makes (batch) and passes (fn, with its first index) the batches of n examples in order, size
// at a time, the last one shorter; each batch's tensors are freed once fn returns.
func consecutiveBatches(n, size int, batch func(idx []int) (Batch, error), fn func(Batch, int) error) error {
	for start := 0; start < n; start += size {
		idx := make([]int, 0, size)
		for i := start; i < min(n, start+size); i++ {
			idx = append(idx, i)
		}
		b, err := batch(idx)
		if err != nil {
			return err
		}
		err = fn(b, start)
		for _, t := range b {
			t.MustFinalizeAll()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ImagesEval is a validation set of images decoded one batch at a time (no augmentation).
type ImagesEval struct {
	Source data.ImageSource
	Pre    data.Preprocessor
}

// Len is the number of images.
func (e ImagesEval) Len() int { return e.Source.Len() }

// Batches decodes and passes consecutive batches of the images.
func (e ImagesEval) Batches(size int, fn func(Batch, int) error) error {
	return consecutiveBatches(e.Source.Len(), size, func(idx []int) (Batch, error) {
		b, err := data.ImageBatch(e.Source, e.Pre, idx)
		return Batch(b), err
	}, fn)
}

// evalSetIdentity is what a checkpoint records of the run's validation set, so that a resume on another one is
// refused as a resume on other training data is: the best checkpoint is chosen by comparing losses on one set.
type evalSetIdentity struct {
	Examples    int    `json:"examples"`
	Fingerprint string `json:"fingerprint"`
}

// evalFingerprint hashes a validation set as the training data is hashed (in-memory examples: every tensor's
// bytes; images: names, labels, classes); "" for a set of another kind (nothing to compare).
func evalFingerprint(set EvalSet) string {
	switch s := set.(type) {
	case ExamplesEval:
		return s.Examples.Fingerprint()
	case ImagesEval:
		return data.SourceFingerprint(s.Source)
	}
	return ""
}

// validationIdentity returns the identity of t.Validation (nil without one, or for a set evalFingerprint cannot
// hash), computed once.
func (t *Trainer) validationIdentity() *evalSetIdentity {
	if t.Validation == nil {
		return nil
	}
	if t.evalIdentity == nil {
		fp := evalFingerprint(t.Validation)
		if fp == "" {
			return nil
		}
		t.evalIdentity = &evalSetIdentity{Examples: t.Validation.Len(), Fingerprint: fp}
	}
	return t.evalIdentity
}

// CheckValidationSet refuses a resumed run whose validation set (Validation) is not the one its checkpoint was
// evaluated on (an error wrapping ErrDataChanged that says how they differ); Fit calls it before the first step.
// A checkpoint written before memfit recorded its validation set, or a set of a kind it cannot hash, is not
// checked.
func (t *Trainer) CheckValidationSet() error {
	was := t.resumedEval
	if was == nil {
		return nil
	}
	now := t.validationIdentity()
	if now == nil {
		return nil
	}
	if err := data.SameData("validation examples", "contents", was.Examples, now.Examples, was.Fingerprint, func() string { return now.Fingerprint }); err != nil {
		return err
	}
	t.resumedEval = nil
	return nil
}

// EvalState is where a run's validation stands; it is saved in every checkpoint (trainer_state.json "eval") so a
// resumed run keeps its best loss, its patience count and whether it stopped early.
type EvalState struct {
	// Evals counts the evaluations done.
	Evals int `json:"evals"`
	// BestLoss is the lowest validation loss so far, at step BestStep (0: no evaluation yet).
	BestLoss float64 `json:"best_loss"`
	BestStep int     `json:"best_step"`
	// BadEvals counts the evaluations in a row since the best one that did not lower the loss.
	BadEvals int `json:"evals_without_improvement"`
	// Stopped says that early stopping ended the run (a resume of it trains no further).
	Stopped bool `json:"stopped_early,omitempty"`
}

// EvalStats is one evaluation of the validation set, as metrics.jsonl records it (kind "eval").
type EvalStats struct {
	Kind string `json:"kind"`
	Step int    `json:"step"`
	// Loss is the mean loss over the whole set: per target token for a language model (so Perplexity is
	// exp(Loss)), per example for a classifier (whose Accuracy is the fraction of examples whose highest logit
	// is their label) and for regression (mean squared error).
	Loss       float64  `json:"eval_loss"`
	Perplexity float64  `json:"eval_perplexity,omitempty"`
	Accuracy   *float64 `json:"eval_accuracy,omitempty"`
	Examples   int      `json:"eval_examples"`
	// Tokens counts the target tokens of a language model's set.
	Tokens  int     `json:"eval_tokens,omitempty"`
	Seconds float64 `json:"eval_seconds"`
	// Best says that this evaluation has the lowest loss so far (its checkpoint is in BestDir); BestLoss and
	// BestStep are the best so far (this one included), BadEvals the evaluations in a row without improvement.
	Best     bool    `json:"best"`
	BestLoss float64 `json:"best_eval_loss"`
	BestStep int     `json:"best_step"`
	BadEvals int     `json:"evals_without_improvement"`
	// EarlyStop says that this evaluation ends the run (Config.EarlyStoppingPatience).
	EarlyStop bool `json:"early_stop,omitempty"`
	// Metrics are the objective's own figures over the whole set (a preference objective's rewards/chosen,
	// logps/chosen, ...: means over its pairs); in metrics.jsonl they are keys of their own, prefixed "eval_" as
	// TRL logs them.
	Metrics map[string]float64 `json:"-"`
}

// MarshalJSON writes the evaluation's fields and, as keys of their own, its Metrics ("eval_rewards/chosen").
func (s EvalStats) MarshalJSON() ([]byte, error) {
	type plain EvalStats // without this method
	return withMetrics(plain(s), s.Metrics, "eval_")
}

// Evaluate computes the trained model's loss (and a classifier's accuracy) over the whole of set, in batches of
// Config.BatchSize, with the current weights. A language model's loss is averaged over target tokens (labels
// other than -100 after the first position), a classifier's over examples.
func (t *Trainer) Evaluate(set EvalSet) (EvalStats, error) {
	start := time.Now()
	if _, _, err := t.Sync(); err != nil {
		return EvalStats{}, err
	}
	if _, ok := t.Config.Preference(); ok {
		return t.evaluatePairs(set, start)
	}
	if t.evalRunner == nil {
		t.evalRunner = runner.NewOutputsRunner(t.Backend, t.Model, evalOutputs(t.Model))
	}
	params, set2 := t.Current()
	var sum float64
	var targets, correct, classified, count int
	classifier := false
	err := set.Batches(max(1, t.Config.BatchSize), func(b Batch, first int) error {
		labels, ok := b["labels"]
		if !ok {
			return fmt.Errorf("the validation data has no labels")
		}
		count += examples(b) // packed sequences count the examples packed into them
		n, err := targetCount(labels)
		if err != nil || n == 0 {
			return err
		}
		outs, err := t.evalRunner.Run(params, set2, b)
		if err != nil {
			return fmt.Errorf("validation examples %d to %d: %w", first, first+b.Size()-1, err)
		}
		defer func() {
			for _, o := range outs {
				o.MustFinalizeAll()
			}
		}()
		var l float64
		if err := tensors.ConstFlatData[float32](outs[0], func(f []float32) { l = float64(f[0]) }); err != nil {
			return err
		}
		sum += l * float64(n)
		targets += n
		if len(outs) > 1 {
			classifier = true
			want, err := intValues(labels)
			if err != nil {
				return err
			}
			got, err := intValues(outs[1])
			if err != nil {
				return err
			}
			for i, w := range want {
				if w == loss.IgnoreIndex {
					continue
				}
				classified++
				if got[i] == w {
					correct++
				}
			}
		}
		return nil
	})
	if err != nil {
		return EvalStats{}, err
	}
	if targets == 0 {
		return EvalStats{}, fmt.Errorf("the validation set has no target to score (every label is -100)")
	}
	s := EvalStats{Kind: "eval", Step: t.Step, Loss: sum / float64(targets), Examples: count,
		Seconds: time.Since(start).Seconds()}
	if classifier {
		acc := float64(correct) / float64(max(1, classified))
		s.Accuracy = &acc
	} else if isLanguageModel(t.Model) {
		s.Tokens, s.Perplexity = targets, math.Exp(s.Loss)
	}
	return s, nil
}

// isLanguageModel reports whether model is a causal language model (its loss is per token).
func isLanguageModel(model Model) bool { return model.Task() == models.TaskCausalLM }

// isRegression reports whether model predicts one number (a sequence classifier with one label: mean squared
// error, no accuracy).
func isRegression(model Model) bool {
	tm, ok := model.(models.TextModel)
	return ok && model.Task() == models.TaskSeqCls && len(tm.TextSpec().Labels) == 1
}

// evalOutputs builds the outputs of an evaluation batch: the model's loss (a mean over the batch's targets) and,
// for a classifier (labels [B]), the predicted class of each example.
func evalOutputs(model Model) func(b models.Bound, batch map[string]*graph.Node) []*graph.Node {
	return func(b models.Bound, batch map[string]*graph.Node) []*graph.Node {
		labels := batch["labels"]
		if labels.Rank() == 1 && !isRegression(model) {
			// The classifiers' loss is the cross entropy of their logits (their Loss): built here from
			// the one forward pass that also gives the predictions.
			logits := graph.ConvertDType(model.Logits(b, batch), dtypes.Float32)
			return []*graph.Node{loss.CrossEntropy(logits, labels, loss.IgnoreIndex), graph.ArgMax(logits, -1, dtypes.Int32)}
		}
		return []*graph.Node{graph.ConvertDType(model.Loss(b, batch), dtypes.Float32)}
	}
}

// targetCount returns the number of targets the loss averages over: labels other than -100, after the first
// position of each sequence for token labels [B, T] (a causal LM predicts token t from those before it).
func targetCount(labels *tensors.Tensor) (int, error) {
	v, err := intValues(labels)
	if err != nil {
		return 0, err
	}
	cols := 1
	if labels.Rank() == 2 {
		cols = labels.Shape().Dim(1)
	}
	n := 0
	for i, x := range v {
		if x != loss.IgnoreIndex && (cols == 1 || i%cols > 0) {
			n++
		}
	}
	return n, nil
}

// validate evaluates t.Validation at the current step and updates EvalState (improvement: a validation loss
// strictly below the best so far; the first evaluation always improves: EvalStats.Best). Fit then writes the
// step's checkpoint and copies it to BestDir.
func (t *Trainer) validate() (EvalStats, error) {
	s, err := t.Evaluate(t.Validation)
	if err != nil {
		return s, fmt.Errorf("validation at step %d: %w", t.Step, err)
	}
	st := &t.EvalState
	st.Evals++
	if !math.IsNaN(s.Loss) && (st.BestStep == 0 || s.Loss < st.BestLoss) {
		st.BestLoss, st.BestStep, st.BadEvals = s.Loss, t.Step, 0
		s.Best = true
	} else {
		st.BadEvals++
	}
	if p := t.Config.EarlyStoppingPatience; p > 0 && st.BadEvals >= p {
		st.Stopped, s.EarlyStop = true, true
	}
	s.BestLoss, s.BestStep, s.BadEvals = st.BestLoss, st.BestStep, st.BadEvals
	return s, nil
}
