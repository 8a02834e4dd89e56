package cli_test

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/safetensors"
)

// writeMislabelled writes the first n examples of writeImageData's set with every label moved to the next class:
// a validation set whose loss rises as the model learns the training labels, so its best evaluation is an early
// one (deterministically: same data, seed and steps).
func writeMislabelled(t *testing.T, path string, n int) {
	t.Helper()
	tmp := filepath.Join(t.TempDir(), "src.safetensors")
	writeImageData(t, tmp, n)
	f, err := safetensors.Open(tmp)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	px, err := f.Tensor("pixel_values")
	if err != nil {
		t.Fatal(err)
	}
	labels := make([]int32, n)
	for i := range labels {
		labels[i] = int32((i%3 + 1) % 3)
	}
	if err := safetensors.WriteTensors(path, map[string]*tensors.Tensor{"pixel_values": px,
		"labels": tensors.FromFlatDataAndDimensions(labels, n)}, "", nil); err != nil {
		t.Fatal(err)
	}
}

// TestTrainValidationKeepsBest: train with --eval-data and --eval-every logs an "eval" record per evaluation
// (and a progress line), keeps the best checkpoint in best/ next to the last one though --keep-checkpoints 1
// prunes the others, and export takes --checkpoint best, last and a step, in both formats: best and last are
// different weights. --eval-split holds out ceil(fraction x N) examples.
func TestTrainValidationKeepsBest(t *testing.T) {
	tmp, model, _ := vitFixture(t)
	data := filepath.Join(tmp, "train24.safetensors")
	writeImageData(t, data, 24)
	eval := filepath.Join(tmp, "eval.safetensors")
	writeMislabelled(t, eval, 9)
	out := filepath.Join(tmp, "run")
	stdout, stderr, code := run(t, "train", "--model", model, "--data", data, "--eval-data", eval, "--out", out,
		"--steps", "10", "--eval-every", "2", "--checkpoint-every", "2", "--keep-checkpoints", "1", "--lr", "0.003",
		"--batch-size", "6", "--train-modules", "classifier", "--log-every", "5")
	if code != 0 {
		t.Fatalf("train exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "eval step 2: loss ") || !strings.Contains(stderr, " acc ") || !strings.Contains(stdout, "best checkpoint (validation loss") {
		t.Errorf("no evaluation progress:\n%s\n%s", stderr, stdout)
	}
	var evals []map[string]any
	for _, l := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
		if l["kind"] == "eval" {
			evals = append(evals, l)
		}
	}
	if len(evals) != 5 {
		t.Fatalf("%d eval records, want 5 (steps 2, 4, ..., 10)", len(evals))
	}
	last := evals[len(evals)-1]
	best := int(last["best_step"].(float64))
	for _, e := range evals {
		if e["eval_examples"].(float64) != 9 || e["eval_accuracy"] == nil || e["eval_loss"].(float64) < last["best_eval_loss"].(float64) {
			t.Errorf("eval record %v (best %v)", e, last["best_eval_loss"])
		}
	}
	if best >= 10 {
		t.Fatalf("the best evaluation is the last (step %d): the test needs one earlier", best)
	}
	for _, f := range []string{"best/trainer_state.json", "checkpoint-10/trainer_state.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing %s", f)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "checkpoint-8")); err == nil {
		t.Errorf("checkpoint-8 not pruned (--keep-checkpoints 1)")
	}
	exported := map[string][]byte{}
	for _, c := range []struct{ checkpoint, step string }{{"best", strconv.Itoa(best)}, {"last", "10"}, {"10", "10"}} {
		dir := filepath.Join(tmp, "merged-"+c.checkpoint)
		so, se, code := run(t, "export", "--run", out, "--checkpoint", c.checkpoint, "--format", "merged", "--out", dir)
		if code != 0 || !strings.Contains(so, "step "+c.step+")") {
			t.Fatalf("export --checkpoint %s: exit %d %s%s; want step %s", c.checkpoint, code, so, se, c.step)
		}
		exported[c.checkpoint], _ = os.ReadFile(filepath.Join(dir, "model.safetensors"))
	}
	if bytes.Equal(exported["best"], exported["last"]) || !bytes.Equal(exported["last"], exported["10"]) {
		t.Errorf("merged exports: best equals last %v, last equals step 10 %v", bytes.Equal(exported["best"], exported["last"]), bytes.Equal(exported["last"], exported["10"]))
	}
	if _, se, code := run(t, "export", "--run", out, "--checkpoint", "best", "--format", "peft", "--out", filepath.Join(tmp, "peft-best")); code != 0 {
		t.Errorf("export peft --checkpoint best: %s", se)
	}
	// A hold-out of the training data instead: 25% of 24 examples.
	out2 := filepath.Join(tmp, "run2")
	if _, stderr, code := run(t, "train", "--model", model, "--data", data, "--eval-split", "0.25", "--out", out2,
		"--steps", "2", "--batch-size", "6"); code != 0 {
		t.Fatalf("train --eval-split: %s", stderr)
	}
	lines := readMetrics(t, filepath.Join(out2, "metrics.jsonl"))
	if e := lines[len(lines)-1]; e["kind"] != "eval" || e["eval_examples"].(float64) != 6 || e["step"].(float64) != 2 {
		t.Errorf("--eval-split 0.25 without --eval-every: last record %v, want the evaluation of 6 examples at the end", e)
	}
}

// writeBadLabels writes the example: 8 ViT examples, one (index 3) labelled 5 for a model of 5 classes.
func writeBadLabels(t *testing.T, path string) {
	t.Helper()
	labels := []int32{0, 1, 2, 5, 4, 0, 1, 2}
	if err := safetensors.WriteTensors(path, map[string]*tensors.Tensor{
		"pixel_values": tensors.FromFlatDataAndDimensions(make([]float32, 8*3*32*32), 8, 3, 32, 32),
		"labels":       tensors.FromFlatDataAndDimensions(labels, 8)}, "", nil); err != nil {
		t.Fatal(err)
	}
}

// TestTrainChecksDataBeforePrinting: a bad example of in-memory data (training or validation) is refused in one
// line naming the file and the example's index, before the resolved config is printed and before any step,
// with nothing written (the output folder is not even left behind).
func TestTrainChecksDataBeforePrinting(t *testing.T) {
	tmp := t.TempDir()
	vit5 := filepath.Join(tmp, "vit5")
	if _, e, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "5", "--out", vit5); code != 0 {
		t.Fatal(e)
	}
	bad := filepath.Join(tmp, "bad.safetensors")
	writeBadLabels(t, bad)
	good := filepath.Join(tmp, "good.safetensors")
	writeImageData(t, good, 12) // labels 0..2, within 5 classes
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	ids := make([]int32, 6*8)
	mask := make([]int32, 6*8)
	for i := range ids {
		ids[i], mask[i] = int32(i%50+1), 1
	}
	ids[4*8+5] = 1 << 20 // past any vocabulary
	badText := filepath.Join(tmp, "ids.safetensors")
	safetensors.WriteTensors(badText, map[string]*tensors.Tensor{
		"input_ids":      tensors.FromFlatDataAndDimensions(ids, 6, 8),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, 6, 8),
		"labels":         tensors.FromFlatDataAndDimensions(append([]int32(nil), ids...), 6, 8)}, "", nil)
	// An IDX pair (MNIST's format) whose image 6 has label 7 for a model of 5 classes.
	idxLabels := []byte{0, 1, 2, 3, 4, 0, 7, 1}
	imgs, labs := filepath.Join(tmp, "images.idx.gz"), filepath.Join(tmp, "labels.idx.gz")
	os.WriteFile(imgs, (&data.IDX{Dims: []int{8, 28, 28}, Data: make([]byte, 8*28*28)}).Encode(), 0o644)
	os.WriteFile(labs, (&data.IDX{Dims: []int{8}, Data: idxLabels}).Encode(), 0o644)
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--model", vit5, "--data", imgs + "," + labs}, []string{"IDX image 6 (0-based) has label 7, outside the model's 5 classes"}},
		{[]string{"--model", vit5, "--data", bad}, []string{"--data " + bad, "example 3 of 8", "labels holds 5", "5 classes"}},
		{[]string{"--model", vit5, "--data", good, "--eval-data", bad, "--eval-every", "1"}, []string{"--eval-data " + bad, "example 3 of 8"}},
		{[]string{"--model", llama, "--data", badText, "--batch-size", "2"}, []string{"--data " + badText, "example 4 of 6", "input_ids holds 1048576", "vocabulary"}},
	} {
		out := filepath.Join(tmp, "out")
		stdout, stderr, code := run(t, append([]string{"train", "--out", out, "--steps", "2"}, c.args...)...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code != 1 || len(lines) != 1 || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr:\n%s\nwant exit 1 and one line", c.args, code, stdout, stderr)
			continue
		}
		t.Log(lines[0])
		for _, w := range c.want {
			if !strings.Contains(lines[0], w) {
				t.Errorf("%v: %q does not say %q", c.args, lines[0], w)
			}
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: the output folder was left behind", c.args)
		}
	}
}

// TestValidationBadInput: validation settings that cannot work are refused in one line each, before anything is
// loaded or written.
func TestValidationBadInput(t *testing.T) {
	tmp, model, data := vitFixture(t) // 12 examples
	eval := filepath.Join(tmp, "eval.safetensors")
	writeMislabelled(t, eval, 3)
	runDir := filepath.Join(tmp, "done")
	if _, se, code := run(t, "train", "--model", model, "--data", data, "--out", runDir, "--steps", "1", "--batch-size", "4"); code != 0 {
		t.Fatal(se)
	}
	out := filepath.Join(tmp, "out")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "--model", model, "--data", data, "--out", out, "--eval-every", "5"}, "need a validation set: give --eval-data PATH or --eval-split"},
		{[]string{"train", "--model", model, "--data", data, "--out", out, "--eval-split", "0.1", "--eval-data", eval}, "choose one"},
		{[]string{"train", "--model", model, "--data", data, "--out", out, "--eval-split", "0.6"}, "eval_split"},
		{[]string{"train", "--model", model, "--data", data, "--out", out, "--eval-split", "-0.1"}, "eval_split must not be negative"},
		{[]string{"train", "--model", model, "--data", data, "--out", out, "--eval-split", "0.1", "--early-stopping-patience", "2"}, "give eval_every too"},
		{[]string{"train", "--model", model, "--data", data, "--out", out, "--eval-data-split", "test"}, "give --eval-data too"},
		{[]string{"train", "--model", model, "--data", data, "--out", out, "--eval-split", "0.4", "--batch-size", "8"}, "fewer than a batch"},
		{[]string{"train", "--model", model, "--data", data, "--out", out, "--eval-data", filepath.Join(tmp, "none.safetensors")}, "no such file"},
		{[]string{"train", "--out", runDir, "--resume", "--eval-every", "2"}, "only --steps may change"},
		{[]string{"export", "--run", runDir, "--checkpoint", "best", "--out", filepath.Join(tmp, "x")}, "no best checkpoint"},
		{[]string{"export", "--run", runDir, "--checkpoint", "7", "--out", filepath.Join(tmp, "x")}, "no checkpoint of step 7 (" + filepath.Join(runDir, "checkpoint-7") + "): the run keeps checkpoint-1"},
	} {
		stdout, stderr, code := run(t, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if code == 0 || len(lines) != 1 || !strings.HasPrefix(lines[0], "finetune: ") || !strings.Contains(lines[0], c.want) || stdout != "" {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant one line naming %q", c.args, code, stderr, c.want)
		}
		for _, p := range []string{out, filepath.Join(tmp, "x")} {
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%v: %s was written", c.args, p)
				os.RemoveAll(p)
			}
		}
	}
}

// evalLines returns the "eval" records of a run's metrics without their timings.
func evalLines(t *testing.T, out string) []string {
	t.Helper()
	var lines []string
	for _, m := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
		if m["kind"] == "eval" {
			delete(m, "eval_seconds")
			b, _ := json.Marshal(m)
			lines = append(lines, string(b))
		}
	}
	return lines
}

// TestTrainValidationResume: the validation keys of a config file (eval_every, eval_split,
// early_stopping_patience) run as the flags do, and a run stopped at step 4 and resumed to 10 logs the same
// evaluations (the same held-out examples, losses, best step and patience count) as the run done in one go.
func TestTrainValidationResume(t *testing.T) {
	tmp, model, _ := vitFixture(t)
	data := filepath.Join(tmp, "train24.safetensors")
	writeImageData(t, data, 24)
	cfg := filepath.Join(tmp, "train.yaml")
	os.WriteFile(cfg, []byte("lr: 0.003\nbatch_size: 4\ntrain_modules: [classifier]\neval_every: 2\neval_split: 0.25\nearly_stopping_patience: 4\n"), 0o644)
	whole, parts := filepath.Join(tmp, "whole"), filepath.Join(tmp, "parts")
	if _, se, code := run(t, "train", "--model", model, "--data", data, "--config", cfg, "--out", whole, "--steps", "10"); code != 0 {
		t.Fatal(se)
	}
	if _, se, code := run(t, "train", "--model", model, "--data", data, "--config", cfg, "--out", parts, "--steps", "4"); code != 0 {
		t.Fatal(se)
	}
	if _, se, code := run(t, "train", "--out", parts, "--resume", "--steps", "10"); code != 0 {
		t.Fatal(se)
	}
	a, b := evalLines(t, whole), evalLines(t, parts)
	if len(a) != 5 || strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Errorf("evaluations in one go:\n%s\nstopped and resumed:\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	if !strings.Contains(a[0], `"eval_examples":6`) {
		t.Errorf("eval_split 0.25 of 24 examples: %s", a[0])
	}
}

// TestValidationRealData: validation on the shared real data: Alpaca JSONL on the shipped llama-tiny (loss and
// perplexity over the held-out tokens) and the CIFAR-10 tar's test split as --eval-data for a ViT (accuracy over
// its 2,000 images, decoded a batch at a time).
func TestValidationRealData(t *testing.T) {
	alpaca := filepath.Join("..", "..", "shared", "data", "alpaca-libre", "alpaca_libre_tasks_v1.jsonl")
	cifar := filepath.Join("..", "..", "shared", "data", "cifar10", "cifar10-subset-jpg.tar")
	for _, p := range []string{alpaca, cifar} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("shared data not here (%s): see ../shared/data/README.md", p)
		}
	}
	tmp := t.TempDir()
	out := filepath.Join(tmp, "alpaca")
	_, se, code := run(t, "train", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", alpaca, "--eval-split", "0.05",
		"--out", out, "--steps", "2", "--seq-len", "256", "--batch-size", "4")
	if code != 0 {
		t.Fatal(se)
	}
	for _, m := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
		if m["kind"] == "eval" {
			loss, ppl := m["eval_loss"].(float64), m["eval_perplexity"].(float64)
			if m["eval_tokens"].(float64) < 1000 || ppl < 1 || math.Abs(math.Log(ppl)-loss) > 1e-6 {
				t.Errorf("alpaca evaluation %v", m)
			}
			t.Logf("alpaca step %v: %v examples, %v tokens, loss %.4f, perplexity %.1f", m["step"], m["eval_examples"], m["eval_tokens"], loss, ppl)
		}
	}
	vit := filepath.Join(tmp, "vit10")
	run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "10", "--out", vit)
	out = filepath.Join(tmp, "cifar")
	if _, se, code := run(t, "train", "--model", vit, "--data", cifar, "--split", "train", "--eval-data", cifar, "--eval-data-split", "test",
		"--out", out, "--steps", "2", "--batch-size", "16"); code != 0 {
		t.Fatal(se)
	}
	lines := readMetrics(t, filepath.Join(out, "metrics.jsonl"))
	if e := lines[len(lines)-1]; e["kind"] != "eval" || e["eval_examples"].(float64) != 2000 || e["eval_accuracy"] == nil {
		t.Errorf("CIFAR-10 test split: %v", e)
	}
}
