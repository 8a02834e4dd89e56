package cli_test

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/llamacpp"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// familyModel writes to dir a tiny random model of the family (its "tiny" preset: two or three layers of
// width 64) with the vocabulary and special tokens of tok (copied along), as llama.cpp's architecture for the
// family takes it (Gemma's sliding pattern and score scale, which llama.cpp hard-codes; Mistral without the
// window llama.cpp's llama architecture ignores). Weights are drawn as the shared goldens draw them (linear
// N(0, 1/fan_in), biases N(0, 0.1²), norms around their identity): peaked next-token distributions, so greedy
// decoding has no near-ties for float noise to flip.
func familyModel(t *testing.T, dir, family string, tokDir string) string {
	t.Helper()
	fam, ok := finetune.FamilyByName(family)
	if !ok {
		t.Fatalf("family %s is not registered", family)
	}
	m, err := fam.Preset("tiny", 0, finetune.ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec, c := m.(lm.Model).Spec, m.(lm.Model).Config
	tok, err := tokenizer.Load(tokDir)
	if err != nil {
		t.Fatal(err)
	}
	c.VocabSize, c.MaxPositionEmbeddings = tok.VocabSize(), 256
	bos, _ := tok.BOS()
	eos, _ := tok.EOS()
	pad, _ := tok.Pad()
	c.BOSTokenID, c.EOSTokenID, c.EOSTokenIDs, c.PadTokenID = bos, eos, []int{eos}, pad
	switch family {
	case "gemma2":
		c.QueryPreAttnScalar = float64(c.HeadDim)
	case "gemma3_text":
		c.Sliding = []bool{true, true, true}
	case "mistral":
		c.Sliding, c.SlidingWindow = nil, 0
	}
	params := models.RandomParams(decoder.Shapes(c), 7, 0xfa, func(name string, dims []int) models.Init {
		switch {
		case len(dims) == 2:
			return models.Init{Std: 1 / math.Sqrt(float64(dims[1]))}
		case strings.HasSuffix(name, "norm.weight") && c.NormPlusOne:
			return models.Init{Std: 0.1}
		case strings.HasSuffix(name, "norm.weight"):
			return models.Init{Const: 1}
		}
		return models.Init{Std: 0.1} // biases
	})
	config, err := spec.ConfigJSON(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := models.SaveCheckpoint(dir, config, params, 0); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if err := os.WriteFile(filepath.Join(dir, f), mustRead(t, filepath.Join(tokDir, f)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestFamiliesEndToEnd: a LoRA run with approx-act and MS-norm (every linear layer, so Phi-3's fused qkv_proj and
// gate_up_proj are targets) on a tiny random model of each decoder family trains (the loss falls over 30 steps
// of War and Peace), resumes exactly (stopped at its step-15 checkpoint and resumed, the same losses and the same
// adapter bytes as the straight run), and exports a PEFT adapter, a merged folder and a GGUF file; memfit's
// greedy tokens from the merged folder equal those from the base model with the adapter; llama.cpp runs the f32
// GGUF (its architecture for the family) to the same greedy tokens, with next-token probabilities within 1e-3 of
// memfit's; MMLU evaluates the base model with the adapter.
func TestFamiliesEndToEnd(t *testing.T) {
	tool := llamaCpp(t)
	tokDir := filepath.Join("..", "pretrained", "llama-tiny")
	tmp := t.TempDir()
	text := filepath.Join(tmp, "text.txt")
	if err := os.WriteFile(text, []byte(passage(t, 20000, 24000)), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(tokDir)
	if err != nil {
		t.Fatal(err)
	}
	prompt := tok.Encode(passage(t, 300000, 200), true)
	for _, family := range []string{"qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3"} {
		t.Run(family, func(t *testing.T) {
			dir := familyModel(t, filepath.Join(tmp, family, "base"), family, tokDir)
			train := func(out string, extra ...string) {
				t.Helper()
				args := append([]string{"train", "--model", dir, "--data", text, "--data-format", "text", "--seq-len", "32", "--batch-size", "4",
					"--lora-targets", "all-linear", "--approx-act", "--ms-norm", "--lr", "1e-2", "--log-every", "1", "--checkpoint-every", "15",
					"--out", out}, extra...)
				if _, errOut, code := run(t, args...); code != 0 {
					t.Fatalf("%v: exit %d: %s", args, code, errOut)
				}
			}
			straight, part := filepath.Join(tmp, family, "run"), filepath.Join(tmp, family, "part")
			train(straight, "--steps", "30")
			train(part, "--steps", "15")
			if _, errOut, code := run(t, "train", "--out", part, "--resume", "--steps", "30"); code != 0 {
				t.Fatalf("resume: exit %d: %s", code, errOut)
			}
			want, got := readMetrics(t, filepath.Join(straight, "metrics.jsonl")), readMetrics(t, filepath.Join(part, "metrics.jsonl"))
			var losses []float64
			for _, m := range want {
				losses = append(losses, m["loss"].(float64))
			}
			first, last := mean(losses[:5]), mean(losses[len(losses)-5:])
			t.Logf("%s: loss %.3f over the first 5 steps, %.3f over the last 5", family, first, last)
			if len(losses) != 30 || !(last < first-0.1) {
				t.Errorf("%s: the loss did not fall over 30 steps: %v", family, losses)
			}
			if len(got) != len(want) || fmt.Sprint(got[len(got)-1]["loss"]) != fmt.Sprint(want[len(want)-1]["loss"]) {
				t.Errorf("%s: the resumed run's last loss %v, the straight run's %v", family, got[len(got)-1]["loss"], want[len(want)-1]["loss"])
			}
			if a, b := mustRead(t, filepath.Join(straight, "adapter", "adapter_model.safetensors")), mustRead(t, filepath.Join(part, "adapter", "adapter_model.safetensors")); !slices.Equal(a, b) {
				t.Errorf("%s: the resumed run's adapter differs from the straight run's", family)
			}
			out := filepath.Join(tmp, family)
			peft := filepath.Join(out, "peft")
			if _, errOut, code := run(t, "export", "--run", straight, "--format", "peft", "--out", peft); code != 0 {
				t.Fatalf("export peft: exit %d: %s", code, errOut)
			}
			merged := exportMerged(t, out, "merged", "--run", straight)
			// Named "lora", not after the family: llama.cpp gives a model whose general.name says "phi3" Phi-3's
			// token attributes, by text ("</s>", "<unk>", ...), which the tokenizer of these tests does not have
			// (docs/gguf.md).
			gguf := exportGGUF(t, out, "lora", "f32", "--run", straight)
			fromMerged, withAdapter := loadMemfitLM(t, merged, ""), loadMemfitLM(t, dir, peft)
			a, b := fromMerged.greedy(t, prompt, 16), withAdapter.greedy(t, prompt, 16)
			if len(a) != 16 || !slices.Equal(a, b) {
				t.Errorf("%s: greedy tokens from the merged folder %v, from the base model with the adapter %v", family, a, b)
			}
			checkGreedyLlamaCpp(t, tool, family, gguf, fromMerged, prompt)
			// MMLU on the base model with the adapter (zero-shot, 4 questions: the evaluation runs, whatever the score
			// of a model that has read 30 batches of a novel).
			res := filepath.Join(out, "mmlu.json")
			if _, errOut, code := run(t, "eval", "mmlu", "--model", dir, "--adapter", peft, "--data", filepath.Join(golden.SharedDir(t), "mmlu"),
				"--subjects", "anatomy", "--limit", "4", "--shots", "0", "--generate", "--out", res); code != 0 {
				t.Fatalf("eval mmlu: exit %d: %s", code, errOut)
			}
			if b := string(mustRead(t, res)); !strings.Contains(b, `"acc_generate"`) || !strings.Contains(b, `"anatomy"`) {
				t.Errorf("%s: eval mmlu's result lacks the subject's log-likelihood and generation scores:\n%.600s", family, b)
			}
		})
	}
}

// checkGreedyLlamaCpp runs the f32 GGUF through llama.cpp from prompt: its greedy tokens must be memfit's and its
// next-token probabilities within probTol of memfit's softmax.
func checkGreedyLlamaCpp(t *testing.T, tool *llamacpp.Tool, name, gguf string, m memfitLM, prompt []int) {
	t.Helper()
	want := m.greedy(t, prompt, greedyTokens)
	res := runLlamaCpp(t, tool, llamacpp.Request{Model: gguf, KVCacheType: "F32",
		Generate: &llamacpp.GenerateRequest{Prompt: prompt, Tokens: greedyTokens, Probabilities: true}})
	if res.Generate == nil {
		t.Fatalf("%s: llama.cpp's answer lacks the generation: %+v", name, res)
	}
	if fmt.Sprint(res.Generate.Tokens) != fmt.Sprint(want) {
		t.Fatalf("%s: llama.cpp's greedy tokens on the f32 GGUF differ from memfit's:\nllama.cpp %v\nmemfit    %v", name, res.Generate.Tokens, want)
	}
	seq := append(append([]int{}, prompt...), want[:greedyTokens-1]...)
	ref := m.softmax(t, seq)[len(prompt)-1:]
	worst := 0.0
	for i, p := range res.Generate.Probabilities {
		for id := range p {
			worst = math.Max(worst, math.Abs(p[id]-ref[i][id]))
		}
	}
	t.Logf("%s: llama.cpp's %d greedy tokens equal memfit's; next-token probabilities within %.2g", name, len(want), worst)
	if worst > probTol {
		t.Errorf("%s: llama.cpp's next-token probabilities differ from memfit's by %.3g (bound %g)", name, worst, probTol)
	}
}

func mean(x []float64) float64 {
	s := 0.0
	for _, v := range x {
		s += v
	}
	return s / float64(len(x))
}
