package bert_test

import (
	"context"

	"github.com/memfit/memfit/internal/gtest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
)

// oneLine fails the test unless err is an error of one line that says want.
func oneLine(t *testing.T, what string, err error, want string) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Errorf("%s: got %v, want one line saying %q", what, err, want)
	}
}

// TestBadInputs: what does not belong to an encoder is refused in one line: a LLaMA adapter on a RoBERTa, BERT's
// WordPiece tokenizer for a RoBERTa, a GLUE task of another label count, pairs where a task takes single
// sentences, text data for a classifier, and a sequence longer than the positions.
func TestBadInputs(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dir := tinyRoberta(t, 2, 3)
	fam, _ := finetune.FamilyByName("roberta")
	m, err := fam.Load(dir, finetune.ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = finetune.ReadAdapter(filepath.Join(root, "pretrained", "llama-tiny-alpaca"), m)
	oneLine(t, "a LLaMA adapter on a RoBERTa", err, "belongs to another model")

	glue := filepath.Join(golden.SharedDir(t), "glue")
	open := func(opts finetune.DataOptions, data string) error {
		_, err := finetune.OpenData(data, opts, m, dir, 4, 1)
		return err
	}
	bertTok := filepath.Join(golden.SharedDir(t), "tokenizers", "bert-base-uncased")
	oneLine(t, "BERT's tokenizer for a RoBERTa", open(finetune.DataOptions{Format: finetune.FormatGLUE, Task: "rte", Tokenizer: bertTok}, glue), "tokens but the model's vocabulary")

	// The same tokenizer check on a model whose vocabulary would hold BERT's: the kind of tokenizer is named.
	big := tinyRobertaVocab(t, 31000)
	mb, err := fam.Load(big, finetune.ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = finetune.OpenData(glue, finetune.DataOptions{Format: finetune.FormatGLUE, Task: "rte", Tokenizer: bertTok}, mb, big, 4, 1)
	oneLine(t, "a WordPiece tokenizer for a large-vocabulary RoBERTa", err, "WordPiece")

	oneLine(t, "STS-B (regression) for a 2-class head", open(finetune.DataOptions{Format: finetune.FormatGLUE, Task: "stsb"}, glue), "GLUE stsb has 1 label(s) (regression) but the model has 2")

	pairs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(pairs, "SST-2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pairs, "SST-2", "train.tsv"), []byte("sentence\tlabel\ngood film\tsecond sentence\t1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	oneLine(t, "pairs on SST-2 (single sentences)", open(finetune.DataOptions{Format: finetune.FormatGLUE, Task: "sst2"}, pairs), "columns")

	text := filepath.Join(golden.SharedDir(t), "text", "war-and-peace.txt")
	oneLine(t, "text data for a classifier", open(finetune.DataOptions{Format: finetune.FormatText}, text), "masked LM")
	oneLine(t, "a sequence longer than the positions", open(finetune.DataOptions{Format: finetune.FormatGLUE, Task: "rte", SeqLen: 100}, glue), "--seq-len 100")
}

// TestSharedNormPEFTRefused: under MS-LN a post-LN LayerNorm trained beside LoRA (train_modules) changes the
// residual stream but not the layers folded with its starting affine: the PEFT export refuses it in one line,
// while the merged export (unfolded with the trained norm) gives the trained model's logits.
func TestSharedNormPEFTRefused(t *testing.T) {
	dir := tinyRoberta(t, 2, 5)
	spec := glueRun(t, dir, "rte", 2)
	spec.Config.TrainModules = []string{"classifier", "roberta.encoder.layer.0.output.LayerNorm"}
	merged := filepath.Join(t.TempDir(), "merged")
	res, err := finetune.Recipe{Spec: spec, Out: filepath.Join(t.TempDir(), "run"), Backend: gtest.Backend(t),
		Export: finetune.Export{Merged: merged}}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Trainer.Release()
	oneLine(t, "PEFT export of a trained shared norm", res.Trainer.ExportAdapter(t.TempDir(), "x"), "use the merged export")
	sameAsMerged(t, res.Trainer, spec, dir, merged)
}
