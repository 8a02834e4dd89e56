package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

func TestEvalGLUEPredictions(t *testing.T) {
	glue := filepath.Join(golden.SharedDir(t), "glue")
	preds := filepath.Join(t.TempDir(), "preds.txt")
	os.WriteFile(preds, []byte(strings.Repeat("1\n", 872)), 0o644)
	out, errOut, code := run(t, "eval", "glue", "--task", "sst2", "--data", glue, "--predictions", preds, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r struct {
		Metrics  map[string]float64 `json:"metrics"`
		Majority float64            `json:"majority_baseline"`
		Hash     string             `json:"data_sha256"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	// All-positive predictions on SST-2 dev: 444 of 872 are positive.
	if r.Metrics["accuracy"] != 444.0/872 || r.Majority != 444.0/872 || len(r.Hash) != 64 {
		t.Errorf("%+v", r)
	}
	// The task folder a user naturally passes stands for the root and the task, with the same result.
	for _, args := range [][]string{{"--data", filepath.Join(glue, "SST-2")}, {"--data", filepath.Join(glue, "SST-2") + "/", "--task", "sst2"}} {
		same, errOut, code := run(t, append([]string{"eval", "glue", "--predictions", preds, "--json"}, args...)...)
		if code != 0 || same != out {
			t.Errorf("%v: exit %d (%s), output differs from --data ROOT --task sst2:\n%s", args, code, errOut, same)
		}
	}
	_, errOut, code = run(t, "eval", "glue", "--data", filepath.Join(glue, "CoLA"), "--task", "sst2", "--predictions", preds)
	if lines := strings.Split(strings.TrimSpace(errOut), "\n"); code != 2 || len(lines) != 1 || !strings.Contains(errOut, "is the GLUE CoLA folder but --task is sst2") {
		t.Errorf("task folder and another --task: exit %d, %q", code, errOut)
	}
	_, errOut, code = run(t, "eval", "glue", "--data", glue, "--predictions", preds)
	if code != 2 || !strings.Contains(errOut, "--task is required") {
		t.Errorf("root without --task: exit %d, %q", code, errOut)
	}
	os.WriteFile(preds, []byte("1\n0\n"), 0o644)
	_, errOut, code = run(t, "eval", "glue", "--task", "sst2", "--data", glue, "--predictions", preds)
	if code != 1 || !strings.Contains(errOut, "2 predictions for the 872 examples") {
		t.Errorf("short predictions: exit %d, %q", code, errOut)
	}
	_, errOut, code = run(t, "eval", "glue", "--task", "qqp", "--data", glue, "--predictions", preds)
	if code != 2 || !strings.Contains(errOut, "unknown GLUE task") {
		t.Errorf("unknown task: exit %d, %q", code, errOut)
	}
}

// TestEvalMMLUShippedLlama scores the shipped tiny LLaMA on a few MMLU questions through the CLI: the results
// file is written with its provenance (and, with --generate, the generation scoring), and a model this small
// scores about chance. The default 5 shots, with the prompts cut to their last 128 tokens (--seq-len): whole
// 5-shot prompts fill the model's 512 positions, and 48 of them took two minutes in CI's plain build (no SIMD).
func TestEvalMMLUShippedLlama(t *testing.T) {
	mmlu := filepath.Join(golden.SharedDir(t), "mmlu")
	res := filepath.Join(t.TempDir(), "mmlu.json")
	out, errOut, code := run(t, "eval", "mmlu", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", mmlu,
		"--subjects", "anatomy,high_school_geography", "--limit", "8", "--seq-len", "128", "--out", res, "--generate")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "micro (over questions)") || !strings.Contains(out, "[social sciences]") || !strings.Contains(out, "acc (generate)") {
		t.Errorf("table:\n%s", out)
	}
	var r struct {
		Shots     int    `json:"shots"`
		Truncated int    `json:"truncated_prompts"`
		Hash      string `json:"data_sha256"`
		Format    string `json:"prompt_format"`
		Micro     struct {
			Questions int      `json:"questions"`
			LL        float64  `json:"acc_loglikelihood"`
			Generate  *float64 `json:"acc_generate"`
		} `json:"micro"`
	}
	b, err := os.ReadFile(res)
	if err != nil || json.Unmarshal(b, &r) != nil {
		t.Fatalf("results file: %v", err)
	}
	t.Logf("tiny LLaMA, 16 questions: %.1f%% (log-likelihood)", 100*r.Micro.LL)
	if r.Shots != 5 || len(r.Hash) != 64 || r.Micro.Questions != 16 || r.Truncated != 16 || r.Format == "" || r.Micro.Generate == nil {
		t.Errorf("results %+v", r)
	}
	if r.Micro.LL > 0.5 {
		t.Errorf("a 1M-parameter model scores %.2f on MMLU: answers leak into the prompt?", r.Micro.LL)
	}
}

// TestTrainGLUETaskFolder: train --data-format glue also takes a task folder, which names the task (the dry run
// prints the resolved root and task), and refuses one that contradicts --task.
func TestTrainGLUETaskFolder(t *testing.T) {
	glue := filepath.Join(golden.SharedDir(t), "glue")
	out, errOut, code := run(t, "train", "--model", "m", "--data", filepath.Join(glue, "CoLA"), "--data-format", "glue",
		"--out", t.TempDir(), "--dry-run")
	root, _ := filepath.Abs(glue)
	if code != 0 || !strings.Contains(out, "data: "+root+"\n") || !strings.Contains(out, "task: cola") {
		t.Errorf("exit %d (%s), resolved run:\n%s", code, errOut, out)
	}
	_, errOut, code = run(t, "train", "--model", "m", "--data", filepath.Join(glue, "CoLA"), "--data-format", "glue",
		"--task", "rte", "--out", t.TempDir(), "--dry-run")
	if code != 2 || !strings.Contains(errOut, "is the GLUE CoLA folder but --task is rte") {
		t.Errorf("CoLA folder with --task rte: exit %d, %q", code, errOut)
	}
}
