package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

// TestEncoderCommands: the commands take a RoBERTa: a tokenizer in RoBERTa's layout (pretrain tokenizer --layout
// roberta), a random masked LM (init --arch roberta), a classifier made from it (init --from --num-labels), LoRA
// training on a GLUE task folder with ReGELU2 + MS-LN (train --data-format glue), eval glue of the model plus its
// adapter, and the merged export, whose eval gives the same metrics. Bad inputs are refused in one line: a LLaMA
// adapter on the RoBERTa, BERT's WordPiece tokenizer for it, pair data where the task takes single sentences.
func TestEncoderCommands(t *testing.T) {
	shared := golden.SharedDir(t)
	llamaAdapter, aerr := filepath.Abs(filepath.Join("..", "pretrained", "llama-tiny-alpaca"))
	if aerr != nil {
		t.Fatal(aerr)
	}
	dir := t.TempDir()
	t.Chdir(dir) // eval glue writes the results of a model outside a run into the current folder
	p := func(name string) string { return filepath.Join(dir, name) }
	full, err := os.ReadFile(filepath.Join(shared, "text", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p("text.txt"), full[:60_000], 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(t, args...)
		if code != 0 {
			t.Fatalf("finetune %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		return out
	}
	refused := func(what, want string, args ...string) {
		t.Helper()
		_, errOut, code := run(t, args...)
		line := strings.TrimSpace(errOut)
		if code == 0 || !strings.Contains(line, want) || strings.Count(line, "\n") > 0 {
			t.Errorf("%s: exit %d, stderr %q: want one line saying %q", what, code, errOut, want)
		}
	}
	mustRun("pretrain", "tokenizer", "--text", p("text.txt"), "--vocab", "320", "--layout", "roberta", "--max-length", "38", "--out", p("tok"))
	mustRun("init", "--arch", "roberta", "--preset", "roberta-mini", "--out", p("mlm"))
	for _, prob := range []string{"0", "1", "-0.2"} { // 0 trained at 15% before: PretrainRoberta's "default"
		refused("pretrain roberta --mask-prob "+prob, "--mask-prob "+prob+": give a share of the tokens between 0 and 1",
			"pretrain", "roberta", "--tokenizer", p("tok"), "--text", p("text.txt"), "--out", p("mlm-bad"), "--mask-prob", prob)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, _ := os.ReadFile(filepath.Join(p("tok"), f))
		if err := os.WriteFile(filepath.Join(p("mlm"), f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustRun("init", "--from", p("mlm"), "--num-labels", "2", "--out", p("cls"))
	glue := filepath.Join(shared, "glue")
	mustRun("train", "--model", p("cls"), "--data", filepath.Join(glue, "RTE"), "--data-format", "glue", "--task", "rte", "--seq-len", "32",
		"--method", "lora", "--lora-targets", "query,key", "--lora-r", "8", "--train-modules", "classifier", "--approx-act", "--ms-norm",
		"--steps", "3", "--batch-size", "4", "--lr", "1e-3", "--out", p("run"))
	evalArgs := []string{"eval", "glue", "--data", glue, "--task", "rte", "--seq-len", "32", "--batch-size", "64"}
	withAdapter := mustRun(append(evalArgs, "--model", p("cls"), "--adapter", p("run/adapter"))...)
	mustRun("export", "--run", p("run"), "--format", "merged", "--out", p("merged"))
	merged := mustRun(append(evalArgs, "--model", p("merged"))...)
	metrics := func(out string) string { return strings.Split(out, ", results in")[0] }
	if !strings.Contains(withAdapter, "accuracy") || metrics(withAdapter) != metrics(merged) {
		t.Errorf("eval glue of model + adapter %q, of the merged export %q: want the same metrics", withAdapter, merged)
	}

	refused("a LLaMA adapter on the RoBERTa", "belongs to another model",
		append(evalArgs, "--model", p("cls"), "--adapter", llamaAdapter)...)
	refused("BERT's WordPiece tokenizer for the RoBERTa", "use the model's own tokenizer",
		"train", "--model", p("cls"), "--data", glue, "--data-format", "glue", "--task", "rte", "--seq-len", "32", "--steps", "1",
		"--tokenizer", filepath.Join(shared, "tokenizers", "bert-base-uncased"), "--out", p("run2"))
	pairs := p("pairs")
	if err := os.MkdirAll(filepath.Join(pairs, "SST-2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pairs, "SST-2", "train.tsv"), []byte("sentence\tlabel\na fine film\tand a second sentence\t1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	refused("pairs on SST-2", "columns", "train", "--model", p("cls"), "--data", pairs, "--data-format", "glue", "--task", "sst2",
		"--seq-len", "32", "--steps", "1", "--out", p("run3"))
}
