package cli_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/tokenizer"
)

// logitsOf runs `logits` on model and returns the logits as rows of [batch][position][vocab].
func logitsOf(t *testing.T, model, inputs string) [][][]float64 {
	t.Helper()
	var out struct{ Logits [][][]float64 }
	if err := json.Unmarshal([]byte(mustRun(t, "logits", "--model", model, "--inputs", inputs)), &out); err != nil {
		t.Fatal(err)
	}
	return out.Logits
}

func softmax(row []float64) []float64 {
	m := math.Inf(-1)
	for _, x := range row {
		m = max(m, x)
	}
	out := make([]float64, len(row))
	var s float64
	for i, x := range row {
		out[i] = math.Exp(x - m)
		s += out[i]
	}
	for i := range out {
		out[i] /= s
	}
	return out
}

func argmax(row []float64) int {
	best := 0
	for i, x := range row {
		if x > row[best] {
			best = i
		}
	}
	return best
}

// compareLogits returns the largest probability difference and the fraction of positions whose top-1 agree.
func compareLogits(t *testing.T, got, want [][][]float64) (maxProb float64, top1 float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	n, agree := 0, 0
	for b := range want {
		for p := range want[b] {
			pg, pw := softmax(got[b][p]), softmax(want[b][p])
			for i := range pw {
				maxProb = max(maxProb, math.Abs(pg[i]-pw[i]))
			}
			n++
			if argmax(got[b][p]) == argmax(want[b][p]) {
				agree++
			}
		}
	}
	return maxProb, float64(agree) / float64(n)
}

// greedy runs generate greedily for n tokens (not stopping at EOS) and returns the completion.
func greedy(t *testing.T, model, prompt string, n int, extra ...string) generated {
	t.Helper()
	args := append([]string{"generate", "--model", model, "--prompt", prompt, "--max-new-tokens", strconv.Itoa(n), "--ignore-eos", "--json"}, extra...)
	g := readGenerated(t, mustRun(t, args...))
	if len(g) != 1 || g[0].NewTokens != n {
		t.Fatalf("%v: %+v", args, g)
	}
	return g[0]
}

// storyInputs writes a logits inputs file of 4 rows of 64 tokens (256 positions) of the shared Alpaca-style
// text, encoded with the tokenizer at tok.
func storyInputs(t *testing.T, tok, path string) {
	t.Helper()
	tk, err := tokenizer.Load(tok)
	if err != nil {
		t.Fatal(err)
	}
	text := "Once upon a time there was a little girl named Lily. She loved to play outside in the sunshine with her dog. " +
		"One day she found a shiny red ball under a big tree, and she ran home to show her mother what she had found. " +
		"Give three tips for staying healthy: eat vegetables, sleep well and walk every day. The capital of France is Paris. "
	ids := tk.Encode(strings.Repeat(text, 4), true)
	if len(ids) < 4*64 {
		t.Fatalf("only %d tokens", len(ids))
	}
	rows := make([][]int, 4)
	for r := range rows {
		rows[r] = ids[r*64 : (r+1)*64]
	}
	b, _ := json.Marshal(map[string]any{"input_ids": rows})
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestGGUFRoundTrip exports llama-tiny with the shipped Alpaca adapter as a merged Hugging Face folder and as
// GGUF f32, f16, bf16 and q8_0, and runs the GGUF files in memfit (generate and logits take --model FILE.gguf): on the
// f32 file, greedy generation (plain and --chat, the tokenizer and chat template rebuilt from the GGUF) equals
// the merged folder's token for token for 32 tokens and the logits are equal; f16, bf16 and q8_0 agree on the top-1
// token at >= 95% of 256 positions with probabilities within 1e-3 (f16), 5e-3 (bf16) and 1e-2 (q8_0). The Ollama Modelfile is written beside each.
func TestGGUFRoundTrip(t *testing.T) {
	tmp := t.TempDir()
	model, alpaca := filepath.Join("..", "pretrained", "llama-tiny"), filepath.Join("..", "pretrained", "llama-tiny-alpaca")
	merged := filepath.Join(tmp, "merged")
	mustRun(t, "export", "--model", model, "--adapter", alpaca, "--format", "merged", "--out", merged)
	inputs := filepath.Join(tmp, "inputs.json")
	storyInputs(t, model, inputs)
	want := logitsOf(t, merged, inputs)
	for _, typ := range []string{"f32", "f16", "bf16", "q8_0"} {
		out := filepath.Join(tmp, "tiny-"+typ+".gguf")
		stdout := mustRun(t, "export", "--model", model, "--adapter", alpaca, "--format", "gguf", "--gguf-type", typ, "--out", out)
		if !strings.Contains(stdout, "wrote "+out+" (gguf "+typ) || !strings.Contains(stdout, "ollama create tiny-"+typ+" -f") {
			t.Fatalf("export output:\n%s", stdout)
		}
		mf, err := os.ReadFile(filepath.Join(tmp, "tiny-"+typ+".Modelfile"))
		if err != nil || !strings.Contains(string(mf), "FROM ./tiny-"+typ+".gguf\n") || !strings.Contains(string(mf), "### Instruction:") {
			t.Fatalf("Modelfile (%v):\n%s", err, mf)
		}
		text := "Once upon a time, there was a llama named Lily. <|end_of_text|>"
		if a, b := mustRun(t, "tokenize", "--tokenizer", out, text), mustRun(t, "tokenize", "--tokenizer", model, text); a != b {
			t.Errorf("tokenize with the GGUF's tokenizer: %s, with the folder's: %s", a, b)
		}
		maxProb, top1 := compareLogits(t, logitsOf(t, out, inputs), want)
		t.Logf("%s: max probability difference %.2g, top-1 agreement %.3f over 256 positions", typ, maxProb, top1)
		switch typ {
		case "f32":
			if maxProb > 1e-6 || top1 != 1 {
				t.Errorf("f32: probabilities differ by %g, top-1 agreement %g", maxProb, top1)
			}
			for _, chat := range [][]string{nil, {"--chat"}} {
				prompt := "Give three tips for staying healthy."
				if g, w := greedy(t, out, prompt, 32, chat...), greedy(t, merged, prompt, 32, chat...); g != w {
					t.Errorf("generate %v on the GGUF:\n%+v\nmerged folder:\n%+v", chat, g, w)
				}
			}
		default:
			// Measured: f16 1e-4, bf16 1.6e-3, q8_0 2.6e-3.
			if limit := map[string]float64{"f16": 1e-3, "bf16": 5e-3, "q8_0": 1e-2}[typ]; maxProb > limit || top1 < 0.95 {
				t.Errorf("%s: probabilities differ by %g, top-1 agreement %g", typ, maxProb, top1)
			}
		}
	}
}

// TestGGUFGoldenModels exports the transformers golden GQA LLaMA (no tokenizer: placeholder vocabulary) and
// llama-tiny with Llama-3.1 rope scaling, tied and untied: the GGUF's logits equal transformers' golden logits
// (llama_a) and the Hugging Face folder's in memfit, and greedy generation on the Llama-3 style models matches.
func TestGGUFGoldenModels(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(golden.SharedDir(t), "golden", "llama_a")
	out := filepath.Join(tmp, "llama_a.gguf")
	stdout := mustRun(t, "export", "--model", dir, "--format", "gguf", "--out", out)
	if !strings.Contains(stdout, "no tokenizer") {
		t.Errorf("export output does not say the model has no tokenizer:\n%s", stdout)
	}
	g := golden.Load(t, "llama_a")
	ref := g.Array(t, "outputs", "logits").Float32s()
	got := logitsOf(t, out, filepath.Join(dir, "golden.json"))
	var flat []float32
	for _, row := range got {
		for _, pos := range row {
			for _, x := range pos {
				flat = append(flat, float32(x))
			}
		}
	}
	if d := golden.RelMaxDiff(flat, ref); d > 1e-5 {
		t.Errorf("llama_a GGUF logits differ from transformers' by %g (relative to the largest)", d)
	}
	prompt := "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her friends, and"
	for _, untied := range []bool{false, true} {
		name := map[bool]string{false: "llama3-tied", true: "llama3-untied"}[untied]
		m := filepath.Join(tmp, name)
		llama3Style(t, m, []int{4094}, untied)
		gg := filepath.Join(tmp, name+".gguf")
		mustRun(t, "export", "--model", m, "--format", "gguf", "--out", gg)
		if a, b := greedy(t, gg, prompt, 32), greedy(t, m, prompt, 32); a != b {
			t.Errorf("%s: generate on the GGUF\n%+v\nthe folder\n%+v", name, a, b)
		}
	}
}

// TestGGUFFromRuns exports a LoRA run trained with MS-norm (its adapters live in the folded basis) and a QLoRA run
// (its base NF4): each GGUF's logits equal the run's merged export's and it generates as the merged export does.
func TestGGUFFromRuns(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join("..", "pretrained", "llama-tiny")
	inputs := filepath.Join(tmp, "inputs.json")
	storyInputs(t, model, inputs)
	story := storyText(t, tmp)
	for _, c := range []struct {
		name  string
		flags []string
	}{{"msnorm-lora", []string{"--ms-norm"}}, {"qlora", []string{"--method", "qlora", "--lora-targets", "all-linear"}}} {
		t.Run(c.name, func(t *testing.T) {
			runDir := filepath.Join(tmp, c.name)
			mustRun(t, append([]string{"train", "--model", model, "--data", story, "--seq-len", "32", "--batch-size", "2", "--steps", "3",
				"--lr", "1e-2", "--out", runDir}, c.flags...)...)
			merged, gg := filepath.Join(tmp, c.name+"-merged"), filepath.Join(tmp, c.name+".gguf")
			mustRun(t, "export", "--run", runDir, "--format", "merged", "--out", merged)
			if stdout := mustRun(t, "export", "--run", runDir, "--format", "gguf", "--out", gg); !strings.Contains(stdout, "step 3") {
				t.Errorf("export output does not name the step:\n%s", stdout)
			}
			if maxProb, top1 := compareLogits(t, logitsOf(t, gg, inputs), logitsOf(t, merged, inputs)); maxProb > 1e-6 || top1 != 1 {
				t.Errorf("probabilities differ by %g, top-1 agreement %g", maxProb, top1)
			}
			if a, b := greedy(t, gg, "Once upon a time", 32), greedy(t, merged, "Once upon a time", 32); a != b {
				t.Errorf("generate on the GGUF\n%+v\nmerged\n%+v", a, b)
			}
		})
	}
}

// TestGGUFChatTemplateKept: a tokenizer chat template memfit cannot translate for Ollama is kept in the GGUF for
// llama.cpp; the Modelfile has no TEMPLATE and says why in a comment, and the export says so.
func TestGGUFChatTemplateKept(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join(tmp, "model")
	copyTree(t, filepath.Join("..", "pretrained", "llama-tiny"), model)
	const tmpl = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
	cfgPath := filepath.Join(model, "tokenizer_config.json")
	var cfg map[string]any
	b, _ := os.ReadFile(cfgPath)
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["chat_template"] = tmpl
	b, _ = json.Marshal(cfg)
	os.WriteFile(cfgPath, b, 0o644)
	out := filepath.Join(tmp, "m.gguf")
	stdout := mustRun(t, "export", "--model", model, "--format", "gguf", "--out", out)
	if !strings.Contains(stdout, "note: the tokenizer's chat template is not one memfit translates for Ollama") {
		t.Errorf("export output:\n%s", stdout)
	}
	mf, _ := os.ReadFile(filepath.Join(tmp, "m.Modelfile"))
	if strings.Contains(string(mf), "\nTEMPLATE") || !strings.Contains(string(mf), "# No TEMPLATE: the tokenizer's chat template is not one memfit translates") {
		t.Errorf("Modelfile:\n%s", mf)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, _, _ := f.String("tokenizer.chat_template"); got != tmpl {
		t.Errorf("tokenizer.chat_template %q, want %q", got, tmpl)
	}
}
