package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/safetensors"
)

// overflowCopy copies the model folder src to dst with the final norm's weight set to 3e38: every weight is
// finite (a load-time check passes it), but the activations overflow, so the logits are not finite.
func overflowCopy(t *testing.T, src, dst string) {
	t.Helper()
	os.MkdirAll(dst, 0o755)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644)
	}
	f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ts := map[string]*tensors.Tensor{}
	for _, name := range f.Names() {
		if ts[name], err = f.Tensor(name); err != nil {
			t.Fatal(err)
		}
	}
	v, err := f.Float32s("model.norm.weight")
	if err != nil {
		t.Fatal(err)
	}
	for i := range v {
		v[i] = 3e38
	}
	ts["model.norm.weight"] = tensors.FromFlatDataAndDimensions(v, len(v))
	if err := safetensors.WriteTensors(filepath.Join(dst, "model.safetensors"), ts, "", nil); err != nil {
		t.Fatal(err)
	}
}

// TestBadInputSweepGenerate runs the bad generation requests and prompt files of issue 28 through the CLI: each
// must end with its exit code (2: the command was called wrongly, 1: a file or the model is bad), one line
// "finetune: ..." naming the cause, nothing generated on stdout, and no panic, stack or Go runtime error text.
// docs/reliability.md lists them ("Issue 28: generation and prompt files").
func TestBadInputSweepGenerate(t *testing.T) {
	tmp := t.TempDir()
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	write := func(name, text string) string {
		p := filepath.Join(tmp, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Files that are one endless line: links to /dev/zero under the names each reader expects.
	zero := func(name string) string {
		p := filepath.Join(tmp, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.Symlink("/dev/zero", p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	long := write("long.jsonl", `{"prompt": "a"}`+"\n"+`{"prompt": "b"}`+"\n"+`{"prompt": "`+strings.Repeat("x", 17<<20)+`"}`+"\n")
	two := write("two.jsonl", `{"prompt": "a"}`+"\n"+`{"prompt": "b"} {"prompt": "c"}`+"\n")
	perRow := write("per-row.jsonl", `{"prompt": "a", "temperature": 0.7, "top_p": 0.9}`+"\n")
	twice := write("twice.jsonl", `{"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}], "system": "z"}`+"\n")
	endsAssistant := write("ends-assistant.jsonl", `{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}`+"\n")
	midSystem := write("mid-system.jsonl", `{"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "x"}, {"role": "user", "content": "Bye"}]}`+"\n")
	mmlu := filepath.Join("..", "..", "shared", "data", "mmlu")
	glue := filepath.Join("..", "..", "shared", "data", "glue")
	// An MMLU folder whose anatomy dev file is endless; a GLUE folder whose SST-2 dev file is.
	mmluZero := filepath.Join(tmp, "mmlu-zero")
	zero("mmlu-zero/dev/anatomy_dev.csv")
	os.MkdirAll(filepath.Join(mmluZero, "test"), 0o755)
	if b, err := os.ReadFile(filepath.Join(mmlu, "test", "anatomy_test.csv")); err == nil {
		os.WriteFile(filepath.Join(mmluZero, "test", "anatomy_test.csv"), b, 0o644)
	}
	glueZero := filepath.Join(tmp, "glue-zero")
	zero("glue-zero/SST-2/dev.tsv")
	overflow := filepath.Join(tmp, "overflow")
	overflowCopy(t, llama, overflow)
	sst2 := filepath.Join(tmp, "sst2")
	if _, stderr, code := run(t, "init", "--from", llama, "--num-labels", "2", "--out", sst2); code != 0 {
		t.Fatal(stderr)
	}
	overflowSST2 := filepath.Join(tmp, "sst2-overflow")
	overflowCopy(t, sst2, overflowSST2)

	gen := func(args ...string) []string {
		return append([]string{"generate", "--model", llama, "--max-new-tokens", "4"}, args...)
	}
	cases := []struct {
		args []string
		code int
		want string
	}{
		// 2. Sampling flags.
		{gen("--prompt", "x", "--temperature", "NaN"), 2, "--temperature NaN: give 0 (greedy) or a finite positive number"},
		{gen("--prompt", "x", "--temperature", "Inf"), 2, "--temperature +Inf"},
		{gen("--prompt", "x", "--temperature", "-0.5"), 2, "--temperature -0.5"},
		{gen("--prompt", "x", "--temperature", "1", "--top-p", "NaN"), 2, "--top-p NaN: give a probability in (0, 1]"},
		{gen("--prompt", "x", "--temperature", "1", "--top-p", "Inf"), 2, "--top-p +Inf"},
		{gen("--prompt", "x", "--temperature", "1", "--top-p", "-0.1"), 2, "--top-p -0.1"},
		{gen("--prompt", "x", "--temperature", "1", "--top-p", "0"), 2, "--top-p 0"},
		{gen("--prompt", "x", "--temperature", "1", "--top-p", "1.5"), 2, "--top-p 1.5"},
		{gen("--prompt", "x", "--temperature", "1", "--top-k", "-1"), 2, "--top-k -1: give 0 (no limit) or more"},
		{gen("--prompt", "x", "--stop", ""), 2, `--stop "": a stop string needs at least one character`},
		{gen("--prompts", perRow), 1, `per-row.jsonl:1: "temperature": memfit reads no per-prompt sampling settings`},
		// 3. Chat templates.
		{gen("--prompt", "x", "--chat", "--chat-template", "llama3"), 2, "--chat-template llama3: the llama3 chat template needs special tokens this tokenizer lacks: <|start_header_id|>, <|end_header_id|>, <|eot_id|>"},
		{gen("--prompt", "x", "--chat", "--chat-template", "chatml"), 2, "lacks: <|im_start|>, <|im_end|>"},
		{gen("--prompts", endsAssistant, "--chat"), 1, "ends-assistant.jsonl:1: the Alpaca template renders a conversation that ends with a user message"},
		{gen("--prompts", midSystem), 1, "mid-system.jsonl:1: the Alpaca template takes a system message only as the first message"},
		{gen("--prompts", twice), 1, "twice.jsonl:1: give the system message once"},
		{gen("--prompt", "x", "--system", "Be brief."), 2, "--system needs --chat"},
		// 4. Bounded lines, one JSON object per line; a file read whole that is not a regular file is refused before it is read.
		{gen("--prompts", "/dev/zero"), 1, "/dev/zero:1: the line is longer than 16 MiB"},
		{gen("--prompts", long), 1, "long.jsonl:3: the line is longer than 16 MiB"},
		{gen("--prompts", two), 1, "two.jsonl:2: trailing data after the JSON object"},
		{[]string{"train", "--model", llama, "--data", zero("zero.txt"), "--out", filepath.Join(tmp, "run-a")}, 1, "zero.txt is a character device, not a regular file"},
		{[]string{"train", "--model", llama, "--data", zero("zero.jsonl"), "--out", filepath.Join(tmp, "run-b")}, 1, "zero.jsonl:1: the line is longer than 16 MiB"},
		{[]string{"eval", "mmlu", "--model", llama, "--data", mmluZero, "--subjects", "anatomy"}, 1, "anatomy_dev.csv is a character device, not a regular file"},
		{[]string{"eval", "glue", "--task", "sst2", "--data", glueZero, "--predictions", write("p.txt", "1\n")}, 1, "dev.tsv is a character device, not a regular file"},
		{[]string{"eval", "glue", "--task", "sst2", "--data", glue, "--predictions", zero("pred-zero.txt")}, 1, "pred-zero.txt is a character device, not a regular file"},
		{[]string{"pretrain", "tokenizer", "--text", zero("corpus.jsonl"), "--out", filepath.Join(tmp, "tok")}, 1, "corpus.jsonl:1: the line is longer than 16 MiB"},
		// 5. Non-finite logits.
		{[]string{"generate", "--model", overflow, "--prompt", "It was", "--max-new-tokens", "8"}, 1, "prompt index 0, step 1: the logits of new token 1 are not finite"},
		{[]string{"generate", "--model", overflow, "--prompt", "It was", "--max-new-tokens", "8", "--temperature", "0.8", "--json"}, 1, "are not finite"},
		{[]string{"eval", "mmlu", "--model", overflow, "--data", mmlu, "--subjects", "anatomy", "--shots", "0", "--limit", "2", "--out", filepath.Join(tmp, "mmlu.json")}, 1, "MMLU anatomy question 1: the model's log-likelihood scores are not finite"},
		{[]string{"eval", "glue", "--task", "sst2", "--model", overflowSST2, "--data", glue}, 1, "GLUE example 1: the classifier's logits are not finite"},
	}
	for _, c := range cases {
		stdout, stderr, code := run(t, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != c.code || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, c.want) {
			t.Errorf("%v: exit %d, last line %q; want exit %d and a line naming %q", c.args, code, last, c.code, c.want)
		}
		if c.args[0] == "generate" && (stdout != "" || len(lines) != 1) {
			t.Errorf("%v: printed %q, and %d lines on stderr; want nothing generated and one line", c.args, stdout, len(lines))
		}
		for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:", "out of memory"} {
			if strings.Contains(stderr, bad) {
				t.Errorf("%v: %q in the output:\n%s", c.args, bad, stderr)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, "mmlu.json")); err == nil {
		t.Error("eval mmlu wrote a results file from non-finite scores")
	}
	t.Logf("%d bad requests, each refused with one line", len(cases))
}
