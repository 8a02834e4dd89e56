package finetune_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/decoder"
)

// alpacaSample writes the first n usable rows (status ok) of the shared alpaca-libre v1 file to a JSONL file in
// dir and returns its path; the test skips without the shared data.
func alpacaSample(t *testing.T, dir string, n int, keep func(instruction, input, output string) bool) (string, []map[string]string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(golden.SharedDir(t), "alpaca-libre", "alpaca_libre_tasks_v1.jsonl"))
	if err != nil {
		t.Skipf("alpaca-libre: %v", err)
	}
	var rows []map[string]string
	var out strings.Builder
	for _, line := range strings.Split(string(src), "\n") {
		var r struct{ Instruction, Input, Output, Status string }
		if json.Unmarshal([]byte(line), &r) != nil || r.Status != "ok" || !keep(r.Instruction, r.Input, r.Output) {
			continue
		}
		row := map[string]string{"instruction": r.Instruction, "input": r.Input, "output": r.Output}
		b, _ := json.Marshal(row)
		out.Write(append(b, '\n'))
		if rows = append(rows, row); len(rows) == n {
			break
		}
	}
	path := filepath.Join(dir, "alpaca.jsonl")
	if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, rows
}

// TestPackedBatchMatchesUnpacked: a batch of examples packed several to a sequence (--packing) gives the same
// loss, the same gradient (its norm) and the same updated weights as the same examples one to a sequence, and
// the step counts the same real tokens and examples (not sequences). The
// model is the shipped llama-tiny (real weights, pretrained on alpaca-libre v1), the examples 12 short real
// Alpaca rows (with and without input), so the attention really would differ if a token saw another example or its
// positions did not restart: every packed sequence holds several examples. Both batches hold all 12 examples,
// and the causal-LM loss is the mean over all target tokens of the batch, so the two are the same sum over the
// same tokens divided by the same count. Standard and memory-efficient attention (whose backward rebuilds the
// block-diagonal mask) both.
func TestPackedBatchMatchesUnpacked(t *testing.T) {
	// Short rows in short sequences: 24 rows in sequences of 512 tokens took 208 s of CI's plain build (no SIMD).
	path, rows := alpacaSample(t, t.TempDir(), 12, func(instruction, input, output string) bool {
		return len(instruction)+len(input)+len(output) < 200
	})
	withInput := 0
	for _, r := range rows {
		if r["input"] != "" {
			withInput++
		}
	}
	if withInput == 0 || withInput == len(rows) {
		t.Fatalf("%d of the %d rows have an input: the test needs rows with and without", withInput, len(rows))
	}
	for _, kind := range []string{"standard", "memory-efficient"} {
		cfg := config(finetune.MethodFull, 1)
		cfg.Attention = kind
		cfg.Eps = 1e-3 // compare the gradients themselves, not AdamW's sign-like first step (TestAccumulationMatchesBigBatch)
		model, err := finetune.LoadModel(filepath.Join("..", "pretrained", "llama-tiny"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		step := func(packing bool) (finetune.StepStats, *finetune.Trainer, int) {
			// One example to a sequence of 160 tokens (the longest row fits: the real-token counts below would
			// differ if one were cut), several to a sequence of 320.
			seqLen := 160
			if packing {
				seqLen = 320
			}
			ex, err := finetune.TextExamples(path, finetune.DataOptions{SeqLen: seqLen, Packing: packing}, model, filepath.Join("..", "pretrained", "llama-tiny"))
			if err != nil {
				t.Fatal(err)
			}
			n := ex.Len()
			l, err := finetune.NewLoader(ex, n, 1, false) // the whole set in one batch
			if err != nil {
				t.Fatal(err)
			}
			b, err := l.Next()
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := b["position_ids"]; ok != packing {
				t.Fatalf("packing %v: batch has position_ids: %v", packing, ok)
			}
			tr, err := finetune.New(model, cfg, gtest.Backend(t))
			if err != nil {
				t.Fatal(err)
			}
			s, err := tr.TrainStep([]finetune.Batch{b})
			if err != nil {
				t.Fatal(err)
			}
			return s, tr, n
		}
		s1, unpacked, rows1 := step(false)
		s2, packed, rows2 := step(true)
		if rows1 != len(rows) || rows2 >= rows1/2 {
			t.Fatalf("%d examples in %d sequences unpacked, %d packed: the test needs several examples per packed sequence", len(rows), rows1, rows2)
		}
		if s1.Tokens != s2.Tokens || s1.Examples != len(rows) || s2.Examples != len(rows) {
			t.Errorf("%s: %d real tokens / %d examples unpacked, %d / %d packed; want %d examples", kind, s1.Tokens, s1.Examples, s2.Tokens, s2.Examples, len(rows))
		}
		if math.Abs(s1.Loss-s2.Loss) > 1e-5*s1.Loss || math.Abs(s1.GradNorm-s2.GradNorm) > 1e-4*s1.GradNorm {
			t.Errorf("%s: loss %.7g / |g| %.7g unpacked, %.7g / %.7g packed", kind, s1.Loss, s1.GradNorm, s2.Loss, s2.GradNorm)
		}
		worst := 0.0
		for n, p := range unpacked.Train {
			worst = max(worst, gtest.MaxAbsDiff(gtest.Float32s(p), gtest.Float32s(packed.Train[n])))
		}
		if worst > 1e-6 {
			t.Errorf("%s: updated weights differ by up to %g", kind, worst)
		}
		t.Logf("%s: %d examples, %d sequences unpacked, %d packed: loss %.6f / %.6f, |g| %.6f / %.6f, weights within %.2g",
			kind, len(rows), rows1, rows2, s1.Loss, s2.Loss, s1.GradNorm, s2.GradNorm, worst)
	}
}

// TestPackedBatchChecked: position_ids are checked with the batch: within the row's positions, the shape of
// input_ids, and only for the causal LM.
func TestPackedBatchChecked(t *testing.T) {
	ids := tensors.FromFlatDataAndDimensions([]int32{1, 2, 3, 4}, 1, 4)
	mask := tensors.FromFlatDataAndDimensions([]int32{1, 1, 1, 1}, 1, 4)
	for _, c := range []struct {
		labels int
		pos    *tensors.Tensor
		want   string
	}{
		{0, tensors.FromFlatDataAndDimensions([]int32{0, 1, 0, 1}, 1, 4), ""},
		{0, tensors.FromFlatDataAndDimensions([]int32{0, 1, 2, 4}, 1, 4), "position_ids"},
		{0, tensors.FromFlatDataAndDimensions([]int32{0, 1, -1, 0}, 1, 4), "position_ids"},
		{0, tensors.FromFlatDataAndDimensions([]int32{0, 1, 0}, 1, 3), "position_ids has shape [1 3], input_ids [1 4]"},
		{2, tensors.FromFlatDataAndDimensions([]int32{0, 1, 0, 1}, 1, 4), "packed sequences are for the causal LM"},
	} {
		cfg, err := llama.Preset("tiny", c.labels)
		if err != nil {
			t.Fatal(err)
		}
		m := lm.Model{Model: &decoder.Model{Config: cfg}, Spec: llama.Spec}
		err = m.CheckBatch(finetune.Batch{"input_ids": ids, "attention_mask": mask, "position_ids": c.pos})
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("position_ids %v (labels %d): %v, want %q", c.pos, c.labels, err, c.want)
		}
	}
}
