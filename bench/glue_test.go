package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/encoder"
	"github.com/memfit/memfit/tokenizer/bpetrain"
)

// TestGLUETable: the GLUE benchmark trains and scores a pair task and the regression task in two variants on a
// tiny random RoBERTa masked LM (a head per task made from it), and writes the paper's table: a row per variant
// with both scores, the mean, the saved activations (smaller with ReGELU2 + MS-LN) and the throughput.
func TestGLUETable(t *testing.T) {
	shared := golden.SharedDir(t)
	text, err := os.ReadFile(filepath.Join(shared, "text", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := bpetrain.Train([]string{string(text[:60_000])}, bpetrain.Options{VocabSize: 320, Layout: bpetrain.LayoutRoBERTa})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "roberta")
	c, _ := encoder.Preset("roberta-mini", 0)
	c.VocabSize, c.MaxPositionEmbeddings = 320, 34
	cj, _ := c.JSON()
	if err := models.SaveCheckpoint(dir, cj, encoder.RandomParams(c, 1), 0); err != nil {
		t.Fatal(err)
	}
	tj, _ := tm.TokenizerJSON()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		t.Fatal(err)
	}
	o := DefaultGLUEOptions()
	o.Model, o.Data, o.Tasks = dir, filepath.Join(shared, "glue"), []string{"rte", "stsb"}
	o.Variants = []finetune.Variant{GLUEVariants[0], GLUEVariants[3]}
	o.MaxSteps, o.BatchSize, o.SeqLen, o.LoRARank, o.EvalBatch = 3, 8, 32, 4, 128
	o.Backend, o.Work = gtest.Backend(t), t.TempDir()
	var progress []string
	o.Progress = func(task string, done, total int) {
		progress = append(progress, fmt.Sprintf("%s %d/%d", task, done, total))
	}
	rep, err := RunGLUE(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(progress, ","), "rte 1/3,rte 2/3,rte 3/3,stsb 1/3,stsb 2/3,stsb 3/3"; got != want {
		t.Errorf("progress %s, want %s", got, want)
	}
	if len(rep.Cells) != 4 {
		t.Fatalf("%d cells, want 4", len(rep.Cells))
	}
	for _, c := range rep.Cells {
		if c.Steps != 3 || c.DevExamples == 0 || c.SamplesPerSecond <= 0 || c.SavedActivationBytes <= 0 || c.PeakBytes <= 0 {
			t.Errorf("cell %+v", c)
		}
	}
	if plain, both := rep.Cells[0], rep.Cells[1]; both.SavedActivationBytes >= plain.SavedActivationBytes {
		t.Errorf("ReGELU2 + MS-LN saved %d bytes, plain %d", both.SavedActivationBytes, plain.SavedActivationBytes)
	}
	var buf bytes.Buffer
	if err := WriteGLUETable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	t.Log("\n" + out)
	for _, want := range []string{"| GELU / LN |", "| ReGELU2 / MS-LN |", "RTE (acc)", "STS-B (Pearson)", "mean", "saved act. (exact)", "samples/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q", want)
		}
	}
}
