package generate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/tokenizer"
)

func TestReadPrompts(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "p.jsonl")
	os.WriteFile(good, []byte(`{"prompt": "Once upon a time"}

{"instruction": "Add the numbers.", "input": "2 and 3"}
{"messages": [{"role": "user", "content": "Hi"}], "system": "Be brief."}
`), 0o644)
	ps, err := ReadPrompts(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 || ps[0].Prompt != "Once upon a time" || ps[1].Input != "2 and 3" || ps[2].Messages[0].Content != "Hi" || ps[2].System != "Be brief." || ps[2].Line != 4 {
		t.Errorf("read %+v", ps)
	}
	for _, c := range []struct{ text, want string }{
		{`{"prompt": "a"}` + "\n" + `{"promt": "b"}`, `p.jsonl:2: json: unknown field "promt"`},
		{`{"prompt": "a", "instruction": "b"}`, "p.jsonl:1: give exactly one of"},
		{`{"input": "a"}`, "p.jsonl:1: give exactly one of"},
		{`{"messages": [{"role": "robot", "content": "x"}]}`, `message role "robot"`},
		{`["a"]`, "p.jsonl:1: json: cannot unmarshal array"},
		{"\n\n", "no prompts"},
		{`{"prompt": "a"}` + "\n" + `{"prompt": "b"} {"prompt": "c"}`, "p.jsonl:2: trailing data after the JSON object"},
		{`{"prompt": "a"}, `, "p.jsonl:1: trailing data after the JSON object"},
		{`{"prompt": "a", "temperature": 0.2}`, `p.jsonl:1: "temperature": memfit reads no per-prompt sampling settings`},
		{`{"prompt": "a", "top_p": 2}`, `p.jsonl:1: "top_p": memfit reads no per-prompt sampling settings`},
		{`{"prompt": "a", "stop": [""]}`, `p.jsonl:1: "stop": memfit reads no per-prompt sampling settings`},
		{`{"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}], "system": "z"}`, "p.jsonl:1: give the system message once"},
		{`{"prompt": "a"}` + "\n" + strings.Repeat(" ", data.MaxLineBytes) + `{"prompt": "b"}`, "p.jsonl:2: the line is longer than 16 MiB"},
	} {
		os.WriteFile(good, []byte(c.text), 0o644)
		if _, err := ReadPrompts(good); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.text, err, c.want)
		}
	}
	if _, err := ReadPrompts(filepath.Join(dir, "missing.jsonl")); err == nil {
		t.Error("a missing file read without error")
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		if _, err := ReadPrompts("/dev/zero"); err == nil || !strings.Contains(err.Error(), "/dev/zero:1: the line is longer than 16 MiB") {
			t.Errorf("/dev/zero: %v", err)
		}
	}
}

// TestFormatter: instructions take the Alpaca prompt as training encodes it; chat prompts take the tokenizer's
// template (Llama-3 here, checked against FormatChat, whose rendering tokenizer's tests check against the
// template), or Alpaca when the tokenizer has none; the stop tokens include the template's end of turn.
func TestFormatter(t *testing.T) {
	tiny, err := tokenizer.Load(filepath.Join("..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	f := Formatter{Tok: tiny}
	ids, text, err := f.Encode(Prompt{Instruction: "Name a colour.", Input: "sky"})
	if err != nil {
		t.Fatal(err)
	}
	want := tokenizer.AlpacaPrompt("Name a colour.", "sky")
	train, labels := tiny.FormatInstruction("Name a colour.", "sky", "Blue.")
	n := 0
	for n < len(labels) && labels[n] == tokenizer.IgnoreIndex {
		n++
	}
	if text != want || !slices.Equal(ids, tiny.Encode(want, true)) || !slices.Equal(ids, train[:n]) {
		t.Errorf("instruction: %q %v; want the Alpaca prompt %q, the prompt part of a training example %v", text, ids, want, train[:n])
	}
	// Plain prompt: continued as it is; with --chat and no template in the tokenizer: Alpaca.
	if ids, _, _ := f.Encode(Prompt{Prompt: "Hello"}); !slices.Equal(ids, tiny.Encode("Hello", true)) {
		t.Errorf("plain prompt %v", ids)
	}
	f.Chat = true
	if tmpl, _ := f.Resolved(); tmpl != TemplateAlpaca {
		t.Errorf("llama-tiny's template resolved to %q, want alpaca", tmpl)
	}
	if ids, _, _ := f.Encode(Prompt{Prompt: "Hello"}); !slices.Equal(ids, tiny.Encode(tokenizer.AlpacaPrompt("Hello", ""), true)) {
		t.Errorf("chat prompt under Alpaca: %v", ids)
	}
	// A system message takes the preamble's place (it was dropped); a conversation keeps its earlier turns as
	// the input (they were dropped, and the last user message kept alone).
	if _, text, _ := f.Encode(Prompt{Prompt: "Hello", System: "Answer in French."}); text != "Answer in French.\n\n### Instruction:\nHello\n\n### Response:\n" {
		t.Errorf("chat prompt with a system message under Alpaca: %q", text)
	}
	conv := []tokenizer.Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello."}, {Role: "user", Content: "Name a colour."}}
	ids, text, err = f.Encode(Prompt{Messages: conv, System: "Be brief."})
	want = "Be brief.\n\n### Instruction:\nName a colour.\n\n### Input:\nUser: Hi\nAssistant: Hello.\n\n### Response:\n"
	if err != nil || text != want || !slices.Equal(ids, tiny.Encode(want, true)) {
		t.Errorf("conversation under Alpaca: %q, %v\nwant %q", text, err, want)
	}
	if _, _, err := f.Encode(Prompt{Messages: conv[:2]}); err == nil || !strings.Contains(err.Error(), "ends with a user message") {
		t.Errorf("a conversation ending with the assistant under Alpaca: %v", err)
	}
	if _, text, _ := f.Encode(Prompt{Instruction: "Name a colour.", System: "Be brief."}); text != "Be brief.\n\n### Instruction:\nName a colour.\n\n### Response:\n" {
		t.Errorf("instruction with a system message: %q", text)
	}
	if _, _, err := (Formatter{Tok: tiny}).Encode(Prompt{Prompt: "Hello", System: "x"}); err == nil || !strings.Contains(err.Error(), "needs chat formatting") {
		t.Errorf("a system message for a plain prompt: %v", err)
	}
	// Llama-3 and ChatML on a tokenizer without their special tokens: refused naming them.
	for _, tmpl := range []string{TemplateLlama3, TemplateChatML} {
		g := Formatter{Tok: tiny, Chat: true, Template: tmpl}
		if _, err := g.Resolved(); err == nil || !strings.Contains(err.Error(), "special tokens this tokenizer lacks") {
			t.Errorf("%s on llama-tiny: %v", tmpl, err)
		}
		if _, _, err := g.Encode(Prompt{Prompt: "Hello"}); err == nil {
			t.Errorf("%s on llama-tiny encoded a prompt", tmpl)
		}
		if _, _, err := g.Encode(Prompt{Instruction: "Hello"}); err != nil {
			t.Errorf("%s: an instruction (Alpaca, no template) refused: %v", tmpl, err)
		}
	}
	if _, _, err := (Formatter{Tok: tiny, Template: "jinja"}).Encode(Prompt{Prompt: "x"}); err == nil || !strings.Contains(err.Error(), "unknown chat template") {
		t.Errorf("unknown template: %v", err)
	}
	eos, _ := tiny.EOS()
	if st := f.StopTokens(eos, -1); !slices.Equal(st, []int{eos}) {
		t.Errorf("llama-tiny stop tokens %v, want [%d]", st, eos)
	}

	l3, err := tokenizer.Load(filepath.Join(golden.SharedDir(t), "tokenizers", "llama3"))
	if err != nil {
		t.Fatal(err)
	}
	f = Formatter{Tok: l3, Chat: true}
	ids, text, err = f.Encode(Prompt{Prompt: "What is 2+2?", System: "Answer briefly."})
	if err != nil {
		t.Fatal(err)
	}
	wantIDs, _, err := l3.FormatChat([]tokenizer.Message{{Role: "system", Content: "Answer briefly."}, {Role: "user", Content: "What is 2+2?"}}, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, wantIDs) || !strings.HasSuffix(text, "<|start_header_id|>assistant<|end_header_id|>\n\n") {
		t.Errorf("Llama-3 chat: %q", text)
	}
	// A conversation: the system message and every turn, in order.
	_, text, err = f.Encode(Prompt{Messages: conv, System: "Be brief."})
	want = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
	if err != nil || text != want {
		t.Errorf("Llama-3 conversation: %q, %v\nwant %q", text, err, want)
	}
	eot, _ := l3.TokenID("<|eot_id|>")
	if st := f.StopTokens(); !slices.Contains(st, eot) {
		t.Errorf("Llama-3 stop tokens %v lack <|eot_id|> %d", st, eot)
	}
}

// TestStreamer: text is written as tokens arrive, never an incomplete character or the start of a stop string,
// and what is written in the end is the reply.
func TestStreamer(t *testing.T) {
	// A byte-level "tokenizer": token i is byte i of the text; decoding turns incomplete UTF-8 into U+FFFD, as
	// byte-level BPE decoders do.
	reply := "Grüße, wörld! END and more"
	decode := func(ids []int) string {
		b := make([]byte, len(ids))
		for i, id := range ids {
			b[i] = byte(id)
		}
		return strings.ToValidUTF8(string(b), string(utf8.RuneError))
	}
	var out bytes.Buffer
	s := &Streamer{W: &out, Decode: decode, Stops: []string{"END"}, StopTokens: []int{0}}
	var seen []string
	for i := 0; i < len(reply); i++ {
		s.Add(int(reply[i]))
		seen = append(seen, out.String())
		if !utf8.ValidString(out.String()) || strings.ContainsRune(out.String(), utf8.RuneError) {
			t.Fatalf("after %d bytes wrote %q", i+1, out.String())
		}
		if strings.Contains(out.String(), "E") {
			t.Fatalf("after %d bytes wrote %q: the start of the stop string", i+1, out.String())
		}
		if strings.HasSuffix(reply[:i+1], "END") {
			break
		}
	}
	s.Add(0) // a stop token is not shown
	if err := s.Finish("Grüße, wörld! "); err != nil {
		t.Fatal(err)
	}
	if out.String() != "Grüße, wörld! " {
		t.Errorf("streamed %q", out.String())
	}
	if fmt.Sprint(seen[len(seen)-1]) == "" {
		t.Error("nothing was streamed before the end")
	}
}
