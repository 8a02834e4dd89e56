package finetune_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/tokenizer"
)

// TestBatchesCheckedAgainstTheModel: a class label past the classifier, a token id past the vocabulary (or
// negative), a label past the vocabulary, a mask that is not 0/1 and a sequence longer than the model's
// positions are refused before the step runs, each with one line naming the value, where it is and the model's
// limit; the step count and weights do not change; -100 labels pass; the logits runner checks the same way.
func TestBatchesCheckedAgainstTheModel(t *testing.T) {
	vitModel, _ := imageTask(t, vit.Options{})
	llamaModel, _ := textTask(t, decoder.Options{})
	vocab := llamaModel.(lm.Model).Config.VocabSize
	ids := func(v ...int32) *tensors.Tensor { return tensors.FromFlatDataAndDimensions(v, 1, len(v)) }
	ones := ids(1, 1, 1)
	px := tensors.FromFlatDataAndDimensions(make([]float32, 2*3*32*32), 2, 3, 32, 32)
	for _, c := range []struct {
		name  string
		model finetune.Model
		batch finetune.Batch
		want  []string
	}{
		{"class label", vitModel, finetune.Batch{"pixel_values": px, "labels": tensors.FromFlatDataAndDimensions([]int32{1, 3}, 2)},
			[]string{"labels holds 3 at [1]", "3 classes"}},
		{"token id", llamaModel, finetune.Batch{"input_ids": ids(1, int32(vocab), 2), "attention_mask": ones, "labels": ids(1, 2, 3)},
			[]string{"input_ids holds", "at [0 1]", "vocabulary has", "tokenizer does not belong"}},
		{"negative id", llamaModel, finetune.Batch{"input_ids": ids(1, -1, 2), "attention_mask": ones, "labels": ids(1, 2, 3)},
			[]string{"input_ids holds -1"}},
		{"lm label", llamaModel, finetune.Batch{"input_ids": ids(1, 2, 3), "attention_mask": ones, "labels": ids(-100, 2, int32(vocab+7))},
			[]string{"labels holds", "-100 leaves a position out"}},
		{"mask", llamaModel, finetune.Batch{"input_ids": ids(1, 2, 3), "attention_mask": ids(1, 2, 1), "labels": ids(1, 2, 3)},
			[]string{"attention_mask holds 2"}},
	} {
		cfg := config(finetune.MethodLoRA, 1)
		tr, err := finetune.New(c.model, cfg, gtest.Backend(t))
		if err != nil {
			t.Fatal(err)
		}
		_, err = tr.TrainStep([]finetune.Batch{c.batch})
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want it to mention %q", c.name, err, w)
			}
		}
		if tr.Step != 0 || tr.Compiles != 0 {
			t.Errorf("%s: the step ran (step %d, %d programs)", c.name, tr.Step, tr.Compiles)
		}
		if _, err := finetune.NewLogitsRunner(gtest.Backend(t), c.model, nil, nil).Logits(c.batch); err == nil || !strings.Contains(err.Error(), c.want[0]) {
			t.Errorf("%s: logits runner: %v", c.name, err)
		}
	}
	ok := finetune.Batch{"input_ids": ids(1, 2, 3), "attention_mask": ids(1, 1, 0), "labels": ids(2, 3, -100)}
	tr, _ := finetune.New(llamaModel, config(finetune.MethodLoRA, 1), gtest.Backend(t))
	if _, err := tr.TrainStep([]finetune.Batch{ok}); err != nil {
		t.Errorf("a valid batch with -100 labels: %v", err)
	}
	long := make([]int32, llamaModel.(lm.Model).Config.MaxPositionEmbeddings+1)
	if err := llamaModel.(lm.Model).CheckBatch(finetune.Batch{"input_ids": ids(long...)}); err == nil || !strings.Contains(err.Error(), "max_position_embeddings") {
		t.Errorf("too long: %v", err)
	}
}

// TestTokenizerMustFitTheModel: a tokenizer with more tokens than the model's vocabulary is refused, naming
// both sizes.
func TestTokenizerMustFitTheModel(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := llama.Preset("tiny", 0)
	for _, vocab := range []int{tok.VocabSize(), tok.VocabSize() - 1} {
		cfg.VocabSize = vocab
		m, err := decoder.New(cfg, decoder.RandomParams(cfg, 1), decoder.Options{})
		if err != nil {
			t.Fatal(err)
		}
		err = finetune.CheckTokenizer(tok, lm.Model{Model: m, Spec: llama.Spec})
		if fits := vocab >= tok.VocabSize(); fits != (err == nil) || (err != nil && !strings.Contains(err.Error(), "do not belong together")) {
			t.Errorf("model vocabulary %d, tokenizer %d: %v", vocab, tok.VocabSize(), err)
		}
	}
}

// TestBatchesWithoutTargetsSkipped: causal-LM batches whose labels are all -100 past position 0 are skipped and
// counted (Hooks.OnSkip, StepStats.SkippedBatches): the run equals one on the other examples alone. Data with no
// target anywhere stops with an error instead of drawing forever.
func TestBatchesWithoutTargetsSkipped(t *testing.T) {
	model, data := textTask(t, decoder.Options{})
	labels := data["labels"].Value().([][]int32)
	for i := 0; i < 8; i++ { // examples 0-7: nothing to learn (position 0's label predicts nothing)
		for j := 1; j < len(labels[i]); j++ {
			labels[i][j] = -100
		}
	}
	data["labels"] = tensors.FromValue(labels)
	rest := finetune.Examples{}
	for k, v := range data {
		rest[k] = tensors.FromValue(v.Value().([][]int32)[8:])
	}
	cfg := config(finetune.MethodLoRA, 3)
	run := func(d finetune.Examples) ([]finetune.StepStats, []int, error) {
		tr, err := finetune.New(model, cfg, gtest.Backend(t))
		if err != nil {
			t.Fatal(err)
		}
		loader, _ := finetune.NewLoader(d, 2, cfg.Seed, false)
		var stats []finetune.StepStats
		var skips []int
		err = tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{
			OnStep: func(s finetune.StepStats) { stats = append(stats, s) },
			OnSkip: func(step, n int) { skips = append(skips, step, n) },
		})
		return stats, skips, err
	}
	got, skips, err := run(data)
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := run(rest)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(skips) != "[1 1 1 2 1 3 1 4]" || got[0].SkippedBatches != 4 || got[2].SkippedBatches != 4 {
		t.Errorf("skips %v, skipped_batches %d", skips, got[0].SkippedBatches)
	}
	for i := range want {
		if got[i].Loss != want[i].Loss || got[i].Loss == 0 {
			t.Errorf("step %d: loss %v, run without the empty examples %v", i+1, got[i].Loss, want[i].Loss)
		}
	}

	none := finetune.Examples{}
	for k, v := range data {
		none[k] = tensors.FromValue(v.Value().([][]int32)[:8])
	}
	if _, _, err := run(none); err == nil || !strings.Contains(err.Error(), "1000 batches in a row have no target token") {
		t.Errorf("data without targets: %v", err)
	}
}
