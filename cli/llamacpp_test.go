package cli_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/llamacpp"
	"github.com/memfit/memfit/runner"
)

// llamaCpp returns the repository's tools/llamacpp, skipping the test only where node or npm is missing (a
// tooling that is there but not installed or broken fails the test).
func llamaCpp(t *testing.T) *llamacpp.Tool {
	t.Helper()
	tool, err := llamacpp.Find(filepath.Join("..", "tools", "llamacpp"))
	if errors.Is(err, llamacpp.ErrNoNode) {
		t.Skipf("llama.cpp checks skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tool
}

func runLlamaCpp(t *testing.T, tool *llamacpp.Tool, req llamacpp.Request) *llamacpp.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := tool.Run(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// memfitLM is a LLaMA causal LM as memfit runs it: the model and its adapters (none for a merged model).
type memfitLM struct {
	model finetune.Llama
	set   *adapter.Set
}

func loadMemfitLM(t *testing.T, model, adapterDir string) memfitLM {
	t.Helper()
	m, err := finetune.LoadModel(model, finetune.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	l, ok := m.(finetune.Llama)
	if !ok {
		t.Fatalf("%s is not a LLaMA", model)
	}
	lm := memfitLM{model: l}
	if adapterDir != "" {
		a, err := finetune.ReadAdapter(adapterDir, m)
		if err != nil {
			t.Fatal(err)
		}
		for n, x := range a.Modules {
			m.Params()[n] = x
		}
		lm.set = a.Set
	}
	return lm
}

// greedy is memfit's generate: n tokens decoded greedily after prompt, with the key/value cache.
func (lm memfitLM) greedy(t *testing.T, prompt []int, n int) []int {
	t.Helper()
	gen := runner.NewGenerator(gtest.Backend(t), lm.model, nil, lm.set)
	out, _, err := gen.Generate([][]int{prompt}, runner.GenerateOptions{MaxNewTokens: n, TopP: 1,
		Pad: max(lm.model.Config.PadTokenID, 0), MaxPositions: lm.model.Config.MaxPositionEmbeddings})
	if err != nil {
		t.Fatal(err)
	}
	return out[0].Tokens
}

// softmax returns memfit's next-token distribution after every prefix of seq (float64 softmax of its float32
// logits).
func (lm memfitLM) softmax(t *testing.T, seq []int) [][]float64 {
	t.Helper()
	ids, mask := make([]int32, len(seq)), make([]int32, len(seq))
	for i, id := range seq {
		ids[i], mask[i] = int32(id), 1
	}
	logits, err := runner.Logits(gtest.Backend(t), lm.model, nil, lm.set, runner.Batch{
		"input_ids": tensors.FromFlatDataAndDimensions(ids, 1, len(seq)), "attention_mask": tensors.FromFlatDataAndDimensions(mask, 1, len(seq))})
	if err != nil {
		t.Fatal(err)
	}
	defer logits.MustFinalizeAll()
	vocab := logits.Shape().Dimensions[2]
	out := make([][]float64, len(seq))
	tensors.ConstFlatData[float32](logits, func(f []float32) {
		for p := range seq {
			row := f[p*vocab : (p+1)*vocab]
			top := math.Inf(-1)
			for _, v := range row {
				top = math.Max(top, float64(v))
			}
			probs, sum := make([]float64, vocab), 0.0
			for i, v := range row {
				probs[i] = math.Exp(float64(v) - top)
				sum += probs[i]
			}
			for i := range probs {
				probs[i] /= sum
			}
			out[p] = probs
		}
	})
	return out
}

func argmax(p []float64) int {
	best := 0
	for i, v := range p {
		if v > p[best] {
			best = i
		}
	}
	return best
}

// llamaCppCase is one model checked against llama.cpp: the GGUF exports (f32 and q8_0) and memfit's model they
// were exported from.
type llamaCppCase struct {
	name      string
	f32, q8   string
	lm        memfitLM
	prompt    []int   // greedy decoding starts here
	sequences [][]int // teacher-forced positions for the q8_0 top-1 agreement (256 in all)
}

const (
	greedyTokens = 32   // llama.cpp's greedy tokens on the f32 GGUF equal memfit's for this many tokens
	probTol      = 1e-3 // and its next-token probabilities are within this of memfit's softmax
	q8Agreement  = 0.95 // with q8_0, the top-1 next token agrees with memfit's at this share of positions
)

// checkAgainstLlamaCpp runs the case's GGUFs through llama.cpp and compares with memfit: greedy tokens and
// next-token probabilities on the f32 file, top-1 agreement on the q8_0 file.
func checkAgainstLlamaCpp(t *testing.T, tool *llamacpp.Tool, c llamaCppCase) {
	t.Helper()
	want := c.lm.greedy(t, c.prompt, greedyTokens)
	if len(want) != greedyTokens {
		t.Fatalf("%s: memfit generated %d tokens, want %d", c.name, len(want), greedyTokens)
	}
	res := runLlamaCpp(t, tool, llamacpp.Request{Model: c.f32,
		Generate: &llamacpp.GenerateRequest{Prompt: c.prompt, Tokens: greedyTokens, Probabilities: true}})
	got := res.Generate
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want) {
		t.Errorf("%s: llama.cpp's greedy tokens on the f32 GGUF differ from memfit's generate:\nllama.cpp %v\nmemfit    %v", c.name, got.Tokens, want)
	}
	// memfit's distributions at the same positions: after the prompt and each generated token but the last.
	seq := append(append([]int{}, c.prompt...), want[:greedyTokens-1]...)
	ref := c.lm.softmax(t, seq)[len(c.prompt)-1:]
	worst, at := 0.0, 0
	for i, p := range got.Probabilities {
		if len(p) != len(ref[i]) {
			t.Fatalf("%s: llama.cpp gives %d probabilities, memfit %d", c.name, len(p), len(ref[i]))
		}
		for id := range p {
			if d := math.Abs(p[id] - ref[i][id]); d > worst {
				worst, at = d, i
			}
		}
	}
	t.Logf("%s: %d greedy tokens equal; next-token probabilities within %.2g of memfit's (worst at step %d)", c.name, len(want), worst, at)
	if worst > probTol || len(got.Probabilities) != greedyTokens {
		t.Errorf("%s: llama.cpp's next-token probabilities (%d steps) differ from memfit's softmax by %.3g at step %d (bound %g)",
			c.name, len(got.Probabilities), worst, at, probTol)
	}

	// q8_0: top-1 agreement over the teacher-forced positions.
	res = runLlamaCpp(t, tool, llamacpp.Request{Model: c.q8, Score: &llamacpp.ScoreRequest{Sequences: c.sequences}})
	agree, total := 0, 0
	for i, s := range c.sequences {
		ref := c.lm.softmax(t, s)
		for p := range s {
			total++
			if res.Score[i].Top[p] == argmax(ref[p]) {
				agree++
			}
		}
	}
	share := float64(agree) / float64(total)
	t.Logf("%s: q8_0 top-1 agreement %d/%d (%.1f%%)", c.name, agree, total, 100*share)
	if total < 256 || share < q8Agreement {
		t.Errorf("%s: q8_0 GGUF's top-1 next token agrees with memfit at %d of %d positions (%.1f%%), want >= %.0f%% over at least 256",
			c.name, agree, total, 100*share, 100*q8Agreement)
	}
}
