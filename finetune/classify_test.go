package finetune_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models/decoder"
)

// TestLlamaClassifierLearns: a LLaMA sequence classifier (pooled at each row's last real token, rows padded
// on the right) learns a rule that needs the whole sequence: label 1 when token 7 occurs anywhere.
func TestLlamaClassifierLearns(t *testing.T) {
	cfg, err := llama.Preset("tiny", 2)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decoder.New(cfg, decoder.RandomParams(cfg, 3), decoder.Options{ApproxActivation: true, MSNorm: true})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 9))
	const n, seq = 256, 10
	ids := make([]int32, n*seq)
	mask := make([]int32, n*seq)
	labels := make([]int32, n)
	for i := 0; i < n; i++ {
		length := 4 + r.IntN(seq-3)
		labels[i] = int32(i % 2)
		pos := r.IntN(length)
		for j := 0; j < seq; j++ {
			switch {
			case j >= length:
				ids[i*seq+j] = int32(cfg.PadTokenID)
			case labels[i] == 1 && j == pos:
				ids[i*seq+j] = 7
			default:
				ids[i*seq+j] = int32(10 + r.IntN(100))
			}
			if j < length {
				mask[i*seq+j] = 1
			}
		}
	}
	data := finetune.Examples{"input_ids": tensors.FromFlatDataAndDimensions(ids, n, seq),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, n, seq), "labels": tensors.FromFlatDataAndDimensions(labels, n)}
	c := config(finetune.MethodFull, 60)
	c.LR, c.Schedule, c.WarmupSteps = 3e-3, "cosine", 6
	stats, tr := fit(t, lm.Model{Model: m, Spec: llama.Spec}, data, c, 32)
	acc, err := finetune.Accuracy(tr.Logits, data, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loss %.3f -> %.3f, training accuracy %.3f", stats[0].Loss, stats[len(stats)-1].Loss, acc)
	if acc < 0.9 {
		t.Errorf("the classifier reaches only %.3f on its training set", acc)
	}
}
