package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/memfit/memfit/internal/golden"
)

type generated struct {
	Index      int    `json:"index"`
	Prompt     string `json:"prompt"`
	Completion string `json:"completion"`
	NewTokens  int    `json:"new_tokens"`
	Stop       string `json:"stop"`
}

func readGenerated(t *testing.T, out string) []generated {
	t.Helper()
	var res []generated
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var g generated
		if err := json.Unmarshal([]byte(line), &g); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		res = append(res, g)
	}
	return res
}

// TestGenerateAdapterEqualsMerged: a LoRA adapter trained with MS-RMSNorm (folded, then unfolded at export)
// generates through `finetune generate --adapter` exactly what the merged export generates, and something
// else than the base model.
func TestGenerateAdapterEqualsMerged(t *testing.T) {
	tmp := t.TempDir()
	data := filepath.Join(tmp, "instr.jsonl")
	var rows []string
	for _, r := range []struct{ in, out string }{{"Name a colour.", "Blue."}, {"Name a fruit.", "An apple."},
		{"Say hello.", "Hello!"}, {"Count to three.", "One, two, three."}} {
		b, _ := json.Marshal(map[string]string{"instruction": r.in, "input": "", "output": r.out})
		rows = append(rows, string(b))
	}
	os.WriteFile(data, []byte(strings.Join(rows, "\n")+"\n"), 0o644)
	model := filepath.Join("..", "pretrained", "llama-tiny")
	out := filepath.Join(tmp, "run")
	if _, errOut, code := run(t, "train", "--model", model, "--data", data, "--seq-len", "64", "--out", out, "--lora-targets", "all-linear",
		"--ms-norm", "--steps", "6", "--batch-size", "4", "--lr", "1e-2"); code != 0 {
		t.Fatalf("train: exit %d: %s", code, errOut)
	}
	peft, merged := filepath.Join(tmp, "peft"), filepath.Join(tmp, "merged")
	for _, e := range [][]string{{"peft", peft}, {"merged", merged}} {
		if _, errOut, code := run(t, "export", "--run", out, "--format", e[0], "--out", e[1]); code != 0 {
			t.Fatalf("export %s: %s", e[0], errOut)
		}
	}
	prompts := filepath.Join(tmp, "prompts.jsonl")
	os.WriteFile(prompts, []byte(`{"instruction": "Name a colour."}
{"prompt": "It was a bright cold day in April, and the clocks were striking"}
`), 0o644)
	gen := func(args ...string) []generated {
		args = append([]string{"generate", "--prompts", prompts, "--max-new-tokens", "20", "--ignore-eos", "--json"}, args...)
		stdout, errOut, code := run(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errOut)
		}
		if !strings.Contains(errOut, "tokens/s") {
			t.Errorf("stderr has no throughput: %s", errOut)
		}
		return readGenerated(t, stdout)
	}
	withAdapter := gen("--model", model, "--adapter", peft, "--tokenizer", model)
	fromMerged := gen("--model", merged, "--tokenizer", model)
	base := gen("--model", model)
	if len(withAdapter) != 2 || len(fromMerged) != 2 {
		t.Fatalf("outputs %v / %v", withAdapter, fromMerged)
	}
	differs := false
	for i := range withAdapter {
		if withAdapter[i] != fromMerged[i] {
			t.Errorf("prompt %d: with the adapter %+v, merged %+v", i, withAdapter[i], fromMerged[i])
		}
		if withAdapter[i].NewTokens != 20 || withAdapter[i].Stop != "length" {
			t.Errorf("prompt %d: %d tokens, stop %s; want 20, length (--ignore-eos)", i, withAdapter[i].NewTokens, withAdapter[i].Stop)
		}
		differs = differs || withAdapter[i].Completion != base[i].Completion
	}
	if !differs {
		t.Errorf("the adapter changed nothing: %+v", base)
	}
}

// TestGenerateCommand: a single prompt is streamed and equals its --json completion; sampling is reproducible
// by seed; bad requests are one-line errors.
func TestGenerateCommand(t *testing.T) {
	model := filepath.Join("..", "pretrained", "llama-tiny")
	prompt := "It was a bright cold day in April"
	streamed, errOut, code := run(t, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "30")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	js, _, code := run(t, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "30", "--json")
	if code != 0 {
		t.Fatal("--json failed")
	}
	g := readGenerated(t, js)
	if len(g) != 1 || streamed != g[0].Completion+"\n" || g[0].Prompt != prompt || g[0].Completion == "" {
		t.Errorf("streamed %q, JSON %+v", streamed, g)
	}
	sample := func(seed string) string {
		out, errOut, code := run(t, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "30", "--temperature", "0.9",
			"--top-p", "0.9", "--top-k", "40", "--seed", seed)
		if code != 0 {
			t.Fatalf("sampling: exit %d: %s", code, errOut)
		}
		return out
	}
	if a, b, c := sample("3"), sample("3"), sample("4"); a != b || a == c {
		t.Errorf("seed 3 gave %q and %q, seed 4 %q", a, b, c)
	}
	if out, _, _ := run(t, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "30", "--stop", " the"); strings.Contains(out, " the") {
		t.Errorf("--stop ' the': %q", out)
	}
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	os.WriteFile(bad, []byte(`{"prompt": "a"}`+"\n"+`{"question": "b"}`+"\n"), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"generate", "--model", model}, 2, "give --prompt TEXT or --prompts FILE.jsonl"},
		{[]string{"generate", "--prompt", "x"}, 2, "--model is required"},
		{[]string{"generate", "--model", model, "--prompt", "x", "--top-p", "1.5"}, 2, "--top-p 1.5"},
		{[]string{"generate", "--model", model, "--prompt", "x", "--max-new-tokens", "0"}, 2, "--max-new-tokens 0"},
		{[]string{"generate", "--model", model, "--prompt", "x", "--chat", "--chat-template", "vicuna"}, 2, "unknown chat template"},
		{[]string{"generate", "--model", model, "--prompts", bad}, 1, `bad.jsonl:2: json: unknown field "question"`},
		{[]string{"generate", "--model", model, "--prompt", "x", "--max-new-tokens", "600"}, 1, "positions"},
		{[]string{"generate", "--model", filepath.Join(t.TempDir(), "none"), "--prompt", "x"}, 1, "none"},
	} {
		_, errOut, code := run(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want exit %d and one line with %q", c.args, code, errOut, c.code, c.want)
		}
	}
}

// TestShippedAlpacaAdapter: pretrained/llama-tiny-alpaca, the shipped llama-tiny fine-tuned with LoRA on
// alpaca-libre v1 (pretrained/README.md has the command), answers held-out instructions (the first 8 accepted
// rows of alpaca-libre v3) in the format of the data's responses: a reply that starts with a capital letter and
// ends with EOS well within 64 tokens. The base model, given the same Alpaca prompts, does neither. (The model has
// 1.3M parameters: what it learned is the format, not the content.)
func TestShippedAlpacaAdapter(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(golden.SharedDir(t), "alpaca-libre", "alpaca_libre_tasks_v3.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, line := range strings.Split(string(src), "\n") {
		var row struct{ Instruction, Input, Status string }
		if json.Unmarshal([]byte(line), &row) != nil || row.Status != "ok" {
			continue
		}
		b, _ := json.Marshal(map[string]string{"instruction": row.Instruction, "input": row.Input})
		if lines = append(lines, string(b)); len(lines) == 8 {
			break
		}
	}
	prompts := filepath.Join(t.TempDir(), "heldout.jsonl")
	os.WriteFile(prompts, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	model := filepath.Join("..", "pretrained", "llama-tiny")
	formatted := func(args ...string) (int, []generated) {
		out, errOut, code := run(t, append([]string{"generate", "--model", model, "--prompts", prompts, "--max-new-tokens", "64", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		gs := readGenerated(t, out)
		n := 0
		for _, g := range gs {
			if g.Stop == "eos" && g.Completion != "" && unicode.IsUpper([]rune(g.Completion)[0]) {
				n++
			}
		}
		return n, gs
	}
	tuned, gs := formatted("--adapter", filepath.Join("..", "pretrained", "llama-tiny-alpaca"))
	base, bs := formatted()
	if tuned < 7 || base > 1 {
		t.Errorf("replies in the learned format: %d of 8 with the adapter (want >= 7), %d of 8 without (want <= 1)\nadapter: %+v\nbase: %+v", tuned, base, gs, bs)
	}
}

// TestGenerateSampledBatchSizes: sampled completions do not depend on --batch-size: each prompt's random stream
// is keyed by its index in the prompt file, so three identical prompts sample three different completions, the
// same ones at batch sizes 1, 2 and 3.
func TestGenerateSampledBatchSizes(t *testing.T) {
	model := filepath.Join("..", "pretrained", "llama-tiny")
	prompts := filepath.Join(t.TempDir(), "same.jsonl")
	os.WriteFile(prompts, []byte(strings.Repeat(`{"prompt": "It was a bright cold day"}`+"\n", 3)), 0o644)
	var first []generated
	for _, bs := range []string{"1", "3", "2"} {
		out, errOut, code := run(t, "generate", "--model", model, "--prompts", prompts, "--max-new-tokens", "12", "--temperature", "1",
			"--seed", "11", "--batch-size", bs, "--json")
		if code != 0 {
			t.Fatalf("--batch-size %s: exit %d: %s", bs, code, errOut)
		}
		g := readGenerated(t, out)
		if len(g) != 3 {
			t.Fatalf("--batch-size %s: %d completions", bs, len(g))
		}
		if first == nil {
			first = g
			if g[0].Completion == g[1].Completion || g[1].Completion == g[2].Completion || g[0].Completion == g[2].Completion {
				t.Errorf("three identical prompts at batch size 1 sampled %q, %q, %q: want three different samples", g[0].Completion, g[1].Completion, g[2].Completion)
			}
			continue
		}
		for i := range g {
			if g[i] != first[i] {
				t.Errorf("prompt %d at --batch-size %s: %+v; at 1: %+v", i, bs, g[i], first[i])
			}
		}
	}
}
