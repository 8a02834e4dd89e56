package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
)

// TestTrainMessagesMatchesAlpaca trains llama-tiny on alpaca-libre rows twice: as the Alpaca JSONL they are, and
// converted to conversations ({"messages": [user: instruction, assistant: output]}), and requires the same loss
// at every step, to the last bit.
//
// Why they must be equal: llama-tiny's tokenizer has no chat template, so --chat-template auto takes the Alpaca
// template (as generate does), which renders [user, assistant] as the Alpaca prompt of the user's message
// followed by the reply and EOS, the prompt masked: the very tokens and labels of the Alpaca row with that
// instruction and an empty input. That holds only for rows without an input (a conversation has no slot for
// Alpaca's input: the turns before the last user message become the "### Input:" lines "User: ..."), and with a
// non-empty output (a row with an empty reply is left out in both forms, and counted), so the test takes the
// first 48 usable rows that have both. The examples, their order and the batches are then the
// same; a difference in the rendering, the masking or the data path would show as a different loss.
func TestTrainMessagesMatchesAlpaca(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(golden.SharedDir(t), "alpaca-libre", "alpaca_libre_tasks_v1.jsonl"))
	if err != nil {
		t.Skipf("alpaca-libre: %v", err)
	}
	tmp := t.TempDir()
	var alpaca, messages strings.Builder
	n := 0
	for _, line := range strings.Split(string(src), "\n") {
		var r struct{ Instruction, Input, Output, Status string }
		if json.Unmarshal([]byte(line), &r) != nil || r.Status != "ok" || strings.TrimSpace(r.Input) != "" ||
			strings.TrimSpace(r.Output) == "" || strings.TrimSpace(r.Instruction) == "" {
			continue
		}
		a, _ := json.Marshal(map[string]string{"instruction": r.Instruction, "input": "", "output": r.Output})
		m, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": r.Instruction}, {"role": "assistant", "content": r.Output}}})
		alpaca.Write(append(a, '\n'))
		messages.Write(append(m, '\n'))
		if n++; n == 48 {
			break
		}
	}
	paths := map[string]string{"alpaca": filepath.Join(tmp, "alpaca.jsonl"), "messages": filepath.Join(tmp, "messages.jsonl")}
	os.WriteFile(paths["alpaca"], []byte(alpaca.String()), 0o644)
	os.WriteFile(paths["messages"], []byte(messages.String()), 0o644)
	losses := map[string][]float64{}
	for _, kind := range []string{"alpaca", "messages"} {
		out := filepath.Join(tmp, "run-"+kind)
		stdout, errOut, code := run(t, "train", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", paths[kind],
			"--out", out, "--method", "full", "--steps", "4", "--batch-size", "4", "--seq-len", "128", "--log-every", "1")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", kind, code, errOut)
		}
		if kind == "messages" {
			// llama-tiny's tokenizer has no chat template: the run says which one its conversations took, and
			// run.yaml records it
			if all := stdout + errOut; !strings.Contains(all, "the tokenizer has no chat template: conversations take memfit's Alpaca prompt") {
				t.Errorf("the run does not say which chat template it used:\n%s", all)
			}
			spec, err := finetune.ReadRunSpec(out)
			if err != nil || spec.DataOptions.ChatTemplate != "alpaca" {
				t.Errorf("run.yaml records the chat template %q (%v), want alpaca", spec.DataOptions.ChatTemplate, err)
			}
		}
		for _, m := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
			losses[kind] = append(losses[kind], m["loss"].(float64))
		}
	}
	if len(losses["alpaca"]) != 4 || fmt.Sprint(losses["alpaca"]) != fmt.Sprint(losses["messages"]) {
		t.Errorf("losses: alpaca %v, messages %v", losses["alpaca"], losses["messages"])
	}
	t.Logf("%d rows, losses %v", n, losses["messages"])
}

// TestTrainPackingReportsRealTokens: --packing trains, says how full its sequences are (and, with --attention
// flash, that packed batches run the memory-efficient attention), records packing in run.yaml, counts only real
// tokens (the progress line's tok/s, metrics' tokens), and resumes exactly (the resumed run packs again).
func TestTrainPackingReportsRealTokens(t *testing.T) {
	tmp := t.TempDir()
	var rows strings.Builder
	for i := 0; i < 24; i++ {
		m, _ := json.Marshal(map[string]any{"messages": []map[string]string{
			{"role": "system", "content": "You answer briefly."},
			{"role": "user", "content": fmt.Sprintf("What is %d plus %d?", i, i+1)},
			{"role": "assistant", "content": fmt.Sprintf("%d.", 2*i+1)}}})
		rows.Write(append(m, '\n'))
	}
	data := filepath.Join(tmp, "chat.jsonl")
	os.WriteFile(data, []byte(rows.String()), 0o644)
	out := filepath.Join(tmp, "run")
	_, errOut, code := run(t, "train", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", data, "--packing",
		"--out", out, "--steps", "2", "--batch-size", "2", "--seq-len", "256", "--log-every", "1", "--attention", "flash")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(errOut, "note: --packing with --attention flash: the fused flash op takes a causal mask and sequence lengths, not the block-diagonal mask") {
		t.Errorf("no note that packed batches do not run the fused flash attention:\n%s", errOut)
	}
	if !strings.Contains(errOut, "packed 24 examples into 4 sequences of 256 tokens (83% real tokens; 14% unpacked)") {
		t.Errorf("no packing note:\n%s", errOut)
	}
	spec, _ := os.ReadFile(filepath.Join(out, "run.yaml"))
	if !strings.Contains(string(spec), "packing: true") {
		t.Errorf("run.yaml lacks packing:\n%s", spec)
	}
	for _, m := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
		// A batch is two of the four sequences, 512 slots of which the conversations fill 83%: tokens counts only theirs.
		if tok := m["tokens"].(float64); tok <= 0 || tok >= 2*256 {
			t.Errorf("step %v: %v tokens; want the real tokens of the two packed sequences (fewer than 512)", m["step"], tok)
		}
	}
	if _, errOut, code = run(t, "train", "--out", out, "--resume", "--steps", "3"); code != 0 {
		t.Fatalf("resume: exit %d: %s", code, errOut)
	}
	// The resumed run packs the data again and continues where it stopped: its step 3 is an uninterrupted run's.
	straight := filepath.Join(tmp, "straight")
	if _, errOut, code = run(t, "train", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", data, "--packing",
		"--out", straight, "--steps", "3", "--batch-size", "2", "--seq-len", "256", "--log-every", "1", "--attention", "flash"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	resumed, want := readMetrics(t, filepath.Join(out, "metrics.jsonl")), readMetrics(t, filepath.Join(straight, "metrics.jsonl"))
	if len(resumed) != 3 || len(want) != 3 || resumed[2]["loss"] != want[2]["loss"] {
		t.Errorf("resumed run's losses %v, uninterrupted %v", resumed, want)
	}
}

// TestBadInputSweepChat runs bad conversation data and chat/packing options through train: each ends with its
// exit code, one line "finetune: ..." naming the file and line (for a row) and the cause, no panic or stack, and
// no output folder. docs/reliability.md lists them ("Issue 30: conversations and packing").
func TestBadInputSweepChat(t *testing.T) {
	tmp := t.TempDir()
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	write := func(name string, lines ...string) string {
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := `{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}`
	alpacaRow := `{"instruction": "Say hi.", "input": "", "output": "Hi."}`
	cases := []struct {
		data  string
		extra []string
		code  int
		want  string
	}{
		{write("role.jsonl", good, `{"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "Hello."}]}`), nil, 1,
			`role.jsonl:2: message 2: role "bot": use system, user or assistant`},
		{write("no-assistant.jsonl", `{"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]}`), nil, 1,
			"no-assistant.jsonl:1: the conversation has no assistant turn"},
		{write("empty.jsonl", good, good, `{"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "Hello."}]}`), nil, 1,
			"empty.jsonl:3: message 1 (user) has empty content"},
		{write("parts.jsonl", `{"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, {"role": "assistant", "content": "Hello."}]}`), nil, 1,
			`parts.jsonl:1: message 1 (user): "content" must be a string (got a list)`},
		{write("number.jsonl", `{"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "Seven."}]}`), nil, 1,
			`number.jsonl:1: message 1 (user): "content" must be a string (got a number)`},
		{write("no-messages.jsonl", `{"messages": []}`), nil, 1, "no-messages.jsonl:1: the conversation has no messages"},
		{write("not-list.jsonl", `{"messages": "Hi"}`), nil, 1, `not-list.jsonl:1: "messages" must be a list of objects with "role" and "content"`},
		{write("late-system.jsonl", `{"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "x"}, {"role": "assistant", "content": "Hello."}]}`), nil, 1,
			"late-system.jsonl:1: message 2: a system message goes first"},
		{write("sharegpt.jsonl", `{"conversations": [{"from": "human", "value": "Hi"}, {"from": "bard", "value": "Hello."}]}`), nil, 1,
			`sharegpt.jsonl:1: message 2: "from" "bard": use system, human or gpt`},
		{write("mixed.jsonl", good, alpacaRow), nil, 1, "mixed.jsonl:2: an Alpaca row (instruction, input, output) in a file of messages rows: one data kind per file"},
		{write("mixed2.jsonl", alpacaRow, good), nil, 1, `mixed2.jsonl:2: a conversation ("messages": [{"role", "content"}, ...]) in a file of alpaca rows: one data kind per file`},
		{write("neither.jsonl", `{"text": "Once upon a time"}`), nil, 1, "neither.jsonl:1: neither an Alpaca row (instruction, input, output), a conversation"},
		{write("ends-user.jsonl", `{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]}`), nil, 1,
			"ends-user.jsonl:1: the Alpaca template learns the reply that ends a conversation: its last message must be the assistant's"},
		{write("llama3.jsonl", good), []string{"--chat-template", "llama3"}, 1, "the llama3 chat template needs special tokens this tokenizer lacks"},
		{write("template.jsonl", good), []string{"--chat-template", "vicuna"}, 2, `--chat-template "vicuna": use one of auto, model, llama3, chatml, alpaca`},
		{write("alpaca.jsonl", alpacaRow), []string{"--chat-template", "chatml"}, 1, "--chat-template renders conversations (messages data);"},
		{write("story.txt", strings.Repeat("Once upon a time there was a model. ", 80)), []string{"--packing"}, 1,
			"--packing packs instruction and conversation examples (alpaca, messages data), not text data"},
	}
	for i, c := range cases {
		out := filepath.Join(tmp, fmt.Sprintf("run-%d", i))
		args := append([]string{"train", "--model", llama, "--data", c.data, "--out", out, "--steps", "1", "--batch-size", "2"}, c.extra...)
		stdout, stderr, code := run(t, args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != c.code || len(lines) != 1 || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, c.want) {
			t.Errorf("%s %v: exit %d, stderr %q; want exit %d and one line naming %q", filepath.Base(c.data), c.extra, code, stderr, c.code, c.want)
		}
		if stdout != "" {
			t.Errorf("%s: printed %q", filepath.Base(c.data), stdout)
		}
		for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:"} {
			if strings.Contains(stderr, bad) {
				t.Errorf("%s: %q in the output:\n%s", filepath.Base(c.data), bad, stderr)
			}
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: %s was created", filepath.Base(c.data), out)
		}
	}
	t.Logf("%d bad conversation files and options, each refused with one line", len(cases))
}

// TestBenchPacking runs bench packing at a tiny size: both rows, every example counted on both sides, less
// padding packed than unpacked, and the ratio line.
func TestBenchPacking(t *testing.T) {
	tmp := t.TempDir()
	var rows strings.Builder
	for i := 0; i < 12; i++ {
		m, _ := json.Marshal(map[string]any{"messages": []map[string]string{
			{"role": "user", "content": fmt.Sprintf("Count to %d.", i+1)},
			{"role": "assistant", "content": strings.Repeat("one ", i+1)}}})
		rows.Write(append(m, '\n'))
	}
	data := filepath.Join(tmp, "chat.jsonl")
	os.WriteFile(data, []byte(rows.String()), 0o644)
	out, errOut, code := run(t, "bench", "packing", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", data,
		"--seq-len", "128", "--batch-size", "2", "--steps", "1", "--rounds", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var unpacked, packed []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 8 && f[0] == "unpacked" {
			unpacked = f
		} else if len(f) == 8 && f[0] == "packed" {
			packed = f
		}
	}
	if unpacked == nil || packed == nil || unpacked[1] != "12" || packed[1] != "12" || unpacked[2] != "12" ||
		!strings.Contains(out, "packed / unpacked real tokens/s: ") || !strings.Contains(out, "load average before: ") {
		t.Fatalf("output:\n%s", out)
	}
	var padU, padP float64
	fmt.Sscanf(unpacked[3], "%g%%", &padU)
	fmt.Sscanf(packed[3], "%g%%", &padP)
	if padP >= padU {
		t.Errorf("padding %v%% packed, %v%% unpacked:\n%s", padP, padU, out)
	}
}

// TestMemoryPacking: memory --packing plans the packed step (position_ids and the per-row mask: more saved than
// unpacked, said in the header) and refuses a model that does not train packed sequences.
func TestMemoryPacking(t *testing.T) {
	saved := map[bool]string{}
	for _, packing := range []bool{false, true} {
		args := []string{"memory", "--model", "llama:tiny", "--batch-size", "2", "--seq-len", "128", "--variants", "plain", "--json"}
		if packing {
			args = append(args, "--packing")
		}
		out, errOut, code := run(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var rep struct {
			Shape    struct{ Packed bool }
			Variants []struct {
				SavedActivationBytes int64 `json:"saved_activation_bytes"`
			}
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Variants) != 1 || rep.Shape.Packed != packing {
			t.Fatalf("%v: %s", err, out)
		}
		saved[packing] = fmt.Sprint(rep.Variants[0].SavedActivationBytes)
	}
	if saved[true] == saved[false] {
		t.Errorf("packed and unpacked steps plan the same saved bytes %s", saved[true])
	}
	if _, errOut, code := run(t, "memory", "--model", "vit:tiny", "--batch-size", "2", "--packing"); code != 2 ||
		!strings.Contains(errOut, "--packing plans packed sequences of a LLaMA causal LM (train --packing); vit:tiny is not one") {
		t.Errorf("vit --packing: exit %d, %s", code, errOut)
	}
}
