package bert_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
)

// TestMaskedLM: text opens as masked-LM rows <s> ... </s> of the sequence length; each batch masks about 15% of
// the real, non-special tokens (labels the original ids there, -100 elsewhere; 80% of them become <mask>); the
// masking is drawn afresh per batch and a restored iterator masks exactly as the original; a few pretraining
// steps lower the loss.
func TestMaskedLM(t *testing.T) {
	dir := tinyRoberta(t, 0, 6)
	fam, _ := finetune.FamilyByName("roberta")
	m, err := fam.Load(dir, finetune.ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	full, err := os.ReadFile(filepath.Join(golden.SharedDir(t), "text", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(text, full[:200_000], 0o644); err != nil {
		t.Fatal(err)
	}
	opts := finetune.DataOptions{Format: finetune.FormatText, SeqLen: 64}
	it, err := finetune.OpenData(text, opts, m, dir, 16, 3)
	if err != nil {
		t.Fatal(err)
	}
	state, _ := it.State()
	b1, _ := it.Next()
	b2, _ := it.Next()
	ids, labels := ints(b1["input_ids"]), ints(b1["labels"])
	var predicted, masked, total int
	for i, l := range labels {
		if i%64 == 0 && ids[i] != 0 || i%64 == 63 && ids[i] != 2 && l == -100 {
			t.Fatalf("row %d is not <s> ... </s>: %d ... %d", i/64, ids[i-i%64], ids[i-i%64+63])
		}
		if i%64 == 0 || i%64 == 63 {
			continue
		}
		total++
		if l != -100 {
			predicted++
			if ids[i] == 4 { // <mask>
				masked++
			}
		}
	}
	share := float64(predicted) / float64(total)
	if math.Abs(share-0.15) > 0.03 || math.Abs(float64(masked)/float64(predicted)-0.8) > 0.1 {
		t.Errorf("%d of %d tokens predicted (%.3f), %d of them masked", predicted, total, share, masked)
	}
	if slices.Equal(ints(b2["labels"]), labels) {
		t.Error("two batches masked alike")
	}
	again, _ := finetune.OpenData(text, opts, m, dir, 16, 3)
	again.Next()
	if err := again.Restore(state); err != nil {
		t.Fatal(err)
	}
	r1, _ := again.Next()
	if !slices.Equal(ints(r1["input_ids"]), ids) || !slices.Equal(ints(r1["labels"]), labels) {
		t.Error("a restored iterator masks differently")
	}

	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRAAlpha, cfg.LoRATarget = finetune.MethodFull, 0, 0, nil
	cfg.Steps, cfg.BatchSize, cfg.LR, cfg.LogEvery = 12, 16, 3e-3, 1
	var losses []float64
	res, err := finetune.Recipe{Spec: finetune.RunSpec{Model: dir, Data: text, DataOptions: opts, Config: cfg}, Backend: gtest.Backend(t),
		Hooks: finetune.RunHooks{Hooks: finetune.Hooks{OnStep: func(s finetune.StepStats) { losses = append(losses, s.Loss) }}}}.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	res.Trainer.Release()
	first, last := (losses[0]+losses[1])/2, (losses[10]+losses[11])/2
	t.Logf("masked-LM loss %.3f -> %.3f (uniform over 400 tokens: %.3f)", first, last, math.Log(400))
	if !(last < first-0.3) {
		t.Errorf("12 pretraining steps moved the loss from %.3f to %.3f", first, last)
	}
}

func ints(t interface{ MustConstFlatData(func(any)) }) []int32 {
	var out []int32
	t.MustConstFlatData(func(f any) { out = append(out, f.([]int32)...) })
	return out
}
