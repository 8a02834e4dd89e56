package bert_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/memfit/memfit/family/bert"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/encoder"
	"github.com/memfit/memfit/tokenizer/bpetrain"
)

func TestMain(m *testing.M) { gtest.Main(m) }

var (
	tokOnce sync.Once
	tokDir  string
	tokErr  error
)

// tinyTokenizer trains (once per test binary) a 400-token byte-level BPE tokenizer in RoBERTa's layout on the
// first 120 kB of ../shared/data/text and returns its folder.
func tinyTokenizer(t *testing.T) string {
	t.Helper()
	shared := golden.SharedDir(t)
	tokOnce.Do(func() {
		var text []byte
		if text, tokErr = os.ReadFile(filepath.Join(shared, "text", "war-and-peace.txt")); tokErr != nil {
			return
		}
		var m *bpetrain.Model
		if m, tokErr = bpetrain.Train([]string{string(text[:120_000])}, bpetrain.Options{VocabSize: 400, Layout: bpetrain.LayoutRoBERTa}); tokErr != nil {
			return
		}
		tokDir, _ = os.MkdirTemp("", "memfit-bert-test-tokenizer-")
		j, _ := m.TokenizerJSON()
		cj, _ := m.TokenizerConfigJSON(64)
		tokErr = os.WriteFile(filepath.Join(tokDir, "tokenizer.json"), j, 0o644)
		if tokErr == nil {
			tokErr = os.WriteFile(filepath.Join(tokDir, "tokenizer_config.json"), cj, 0o644)
		}
	})
	if tokErr != nil {
		t.Fatal(tokErr)
	}
	return tokDir
}

// tinyRobertaVocab is tinyRoberta's classifier with a vocabulary of vocab tokens.
func tinyRobertaVocab(t *testing.T, vocab int) string {
	t.Helper()
	dir := tinyRoberta(t, 2, 4)
	c, err := encoder.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize = vocab
	cj, _ := c.JSON()
	if err := models.SaveCheckpoint(dir, cj, encoder.RandomParams(c, 4), 0); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tinyRoberta writes a random RoBERTa (the tiny preset's shape, 66 positions: 64 tokens) with labels classes
// (0: a masked LM) and the tiny tokenizer, and returns its folder.
func tinyRoberta(t *testing.T, labels int, seed uint64) string {
	t.Helper()
	tok := tinyTokenizer(t)
	c, err := encoder.Preset("roberta-mini", labels)
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize, c.MaxPositionEmbeddings = 400, 66
	cj, _ := c.JSON()
	dir := filepath.Join(t.TempDir(), "roberta")
	if err := models.SaveCheckpoint(dir, cj, encoder.RandomParams(c, seed), 0); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, _ := os.ReadFile(filepath.Join(tok, f))
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// glueRun is a LoRA run of a GLUE task on model: the paper's targets (query, key), the classifier trained as
// PEFT's modules_to_save, ReGELU2 and MS-LN on, a few steps of 8 sequences of 64 tokens.
func glueRun(t *testing.T, model, task string, steps int) finetune.RunSpec {
	cfg := finetune.Defaults()
	cfg.LoRARank, cfg.LoRAAlpha, cfg.LoRATarget, cfg.TrainModules = 4, 8, []string{"query", "key"}, []string{"classifier"}
	cfg.Steps, cfg.BatchSize, cfg.LR, cfg.LogEvery = steps, 8, 1e-3, 1
	cfg.ApproxAct, cfg.MSNorm = true, true
	return finetune.RunSpec{Model: model, Data: filepath.Join(golden.SharedDir(t), "glue"),
		DataOptions: finetune.DataOptions{Format: finetune.FormatGLUE, Task: task, SeqLen: 64}, Config: cfg}
}

// TestGLUETrainExport: a RoBERTa classifier trains on a GLUE pair task (RTE) with LoRA on query and key under
// ReGELU2 + MS-LN; its PEFT adapter (task_type SEQ_CLS, the classifier in modules_to_save, query/key targets)
// applied to the plain model, and its merged export loaded by the stock loader, give the trained model's logits.
func TestGLUETrainExport(t *testing.T) {
	dir := tinyRoberta(t, 2, 1)
	out := filepath.Join(t.TempDir(), "run")
	merged := filepath.Join(t.TempDir(), "merged")
	var losses []float64
	r := finetune.Recipe{Spec: glueRun(t, dir, "rte", 6), Out: out, Backend: gtest.Backend(t),
		Export: finetune.Export{Adapter: true, Merged: merged},
		Hooks:  finetune.RunHooks{Hooks: finetune.Hooks{OnStep: func(s finetune.StepStats) { losses = append(losses, s.Loss) }}}}
	res, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Trainer.Release()
	if len(losses) != 6 {
		t.Fatalf("%d steps logged, want 6", len(losses))
	}
	tr := res.Trainer
	it, err := finetune.OpenData(r.Spec.Data, r.Spec.DataOptions, tr.Model, dir, 8, 5)
	if err != nil {
		t.Fatal(err)
	}
	batch, _ := it.Next()
	if got := batch["input_ids"].Shape().Dimensions; !slices.Equal(got, []int{8, 64}) {
		t.Fatalf("batch input_ids %v", got)
	}
	if _, ok := batch["token_type_ids"]; ok {
		t.Error("a RoBERTa batch carries token_type_ids (RoBERTa's tokenizer gives none)")
	}
	delete(batch, "labels")
	want, err := tr.Logits(batch)
	if err != nil {
		t.Fatal(err)
	}
	wantV := gtest.Float32s(want)

	raw, err := os.ReadFile(filepath.Join(res.AdapterDir, finetune.AdapterConfig))
	if err != nil {
		t.Fatal(err)
	}
	var ac map[string]any
	if err := json.Unmarshal(raw, &ac); err != nil {
		t.Fatal(err)
	}
	if ac["task_type"] != "SEQ_CLS" || !strings.Contains(strings.Join(anyStrings(ac["modules_to_save"]), ","), "classifier") {
		t.Errorf("adapter_config.json: task_type %v, modules_to_save %v", ac["task_type"], ac["modules_to_save"])
	}
	for _, target := range anyStrings(ac["target_modules"]) {
		if !strings.HasSuffix(target, ".query") && !strings.HasSuffix(target, ".key") {
			t.Errorf("target module %q is not a query or key projection", target)
		}
	}
	plainFam, _ := finetune.FamilyByName("roberta")
	plain, err := plainFam.Load(dir, finetune.ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	imported, err := finetune.ReadAdapter(res.AdapterDir, plain)
	if err != nil {
		t.Fatal(err)
	}
	params := models.Params{}
	for n, v := range plain.Params() {
		params[n] = v
	}
	for n, v := range imported.Modules {
		params[n] = v
	}
	got, err := finetune.Logits(gtest.Backend(t), plain, params, imported.Set, batch)
	if err != nil {
		t.Fatal(err)
	}
	if d := gtest.MaxRelDiff(gtest.Float32s(got), wantV, 1); d > 1e-4 {
		t.Errorf("the PEFT adapter on the plain model: logits differ by %g", d)
	}
	base, err := finetune.Logits(gtest.Backend(t), plain, nil, nil, batch)
	if err != nil {
		t.Fatal(err)
	}
	if d := gtest.MaxRelDiff(gtest.Float32s(base), wantV, 1); d < 1e-3 {
		t.Errorf("training moved the logits by %g only: the comparisons above prove nothing", d)
	}
	m, err := plainFam.Load(merged, finetune.ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err = finetune.Logits(gtest.Backend(t), m, nil, nil, batch)
	if err != nil {
		t.Fatal(err)
	}
	if d := gtest.MaxRelDiff(gtest.Float32s(got), wantV, 1); d > 1e-4 {
		t.Errorf("the merged export: logits differ by %g", d)
	}
	if _, err := os.Stat(filepath.Join(merged, "tokenizer.json")); err != nil {
		t.Errorf("the merged export has no tokenizer: %v", err)
	}
}

func anyStrings(v any) []string {
	var out []string
	if list, ok := v.([]any); ok {
		for _, x := range list {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// TestRegressionAndFull: STS-B trains a one-label regression head (float labels, MSE), with full fine-tuning and
// per-layer checkpointing; its merged export restores transformers' layout (every LayerNorm back, the folded
// linears unfolded with the trained norms) and the same logits.
func TestRegressionAndFull(t *testing.T) {
	dir := tinyRoberta(t, 1, 2)
	spec := glueRun(t, dir, "stsb", 3)
	spec.Config.Method, spec.Config.LoRARank, spec.Config.LoRAAlpha, spec.Config.LoRATarget, spec.Config.TrainModules = finetune.MethodFull, 0, 0, nil, nil
	spec.Config.GradCkpt = true
	merged := filepath.Join(t.TempDir(), "merged")
	res, err := finetune.Recipe{Spec: spec, Backend: gtest.Backend(t), Export: finetune.Export{Merged: merged}}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Trainer.Release()
	m := sameAsMerged(t, res.Trainer, spec, dir, merged)
	if len(m.Params()) != len(encoder.Shapes(m.(bert.Encoder).Config)) {
		t.Errorf("the merged export has %d tensors, the architecture %d", len(m.Params()), len(encoder.Shapes(m.(bert.Encoder).Config)))
	}
}

// sameAsMerged checks that the merged export in merged, loaded by the stock loader, gives the trained model's
// logits on a batch of the run's data, and returns that model; regression batches must carry float scores.
func sameAsMerged(t *testing.T, tr *finetune.Trainer, spec finetune.RunSpec, dir, merged string) finetune.Model {
	t.Helper()
	it, err := finetune.OpenData(spec.Data, spec.DataOptions, tr.Model, dir, 8, 5)
	if err != nil {
		t.Fatal(err)
	}
	batch, _ := it.Next()
	if tr.Model.(bert.Encoder).Config.Regression() && batch["labels"].DType().String() != "Float32" {
		t.Errorf("regression labels are %s, want float32 scores", batch["labels"].DType())
	}
	delete(batch, "labels")
	want, err := tr.Logits(batch)
	if err != nil {
		t.Fatal(err)
	}
	fam, _ := finetune.FamilyByName("roberta")
	m, err := fam.Load(merged, finetune.ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := finetune.Logits(gtest.Backend(t), m, nil, nil, batch)
	if err != nil {
		t.Fatal(err)
	}
	if d := gtest.MaxRelDiff(gtest.Float32s(got), gtest.Float32s(want), 1); d > 1e-4 {
		t.Errorf("the merged export: logits differ by %g", d)
	}
	return m
}
