package ollama

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/template"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/tokenizer"
)

type message struct{ Role, Content string }

// render executes a Modelfile's TEMPLATE with text/template, as Ollama does, on a conversation.
func render(t *testing.T, modelfile string, data map[string]any) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)TEMPLATE """(.*?)"""`).FindStringSubmatch(modelfile)
	if m == nil {
		t.Fatalf("no TEMPLATE in\n%s", modelfile)
	}
	tmpl, err := template.New("t").Parse(m[1])
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, data); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestTemplatesRenderAsMemfit: each Modelfile TEMPLATE renders a conversation as memfit's generate renders it
// (Llama-3 with the shared Llama-3 tokenizer's FormatChat, ChatML, the Alpaca prompt with and without a system
// message), and lists the format's end-of-turn markers and the given EOS as stops.
func TestTemplatesRenderAsMemfit(t *testing.T) {
	conv := []message{{"system", "You are terse."}, {"user", "Hi there"}, {"assistant", "Hello."}, {"user", "Name a color."}}
	msgs := make([]tokenizer.Message, len(conv))
	for i, m := range conv {
		msgs[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	tok, err := tokenizer.Load(filepath.Join(golden.SharedDir(t), "tokenizers", "llama3"))
	if err != nil {
		t.Fatal(err)
	}
	ids, _, err := tok.FormatChat(msgs, tokenizer.ChatLlama3, true)
	if err != nil {
		t.Fatal(err)
	}
	mf, ok := Modelfile("m.gguf", "m.Modelfile", Llama3, []string{"<|end_of_text|>"}, "")
	if !ok || !strings.Contains(mf, "FROM ./m.gguf\n") || !strings.Contains(mf, `PARAMETER stop "<|eot_id|>"`) || !strings.Contains(mf, `PARAMETER stop "<|end_of_text|>"`) {
		t.Fatalf("llama3 Modelfile:\n%s", mf)
	}
	want := strings.TrimPrefix(tok.Decode(ids, false), "<|begin_of_text|>")
	if got := render(t, mf, map[string]any{"Messages": conv}); got != want {
		t.Errorf("llama3\n got %q\nwant %q", got, want)
	}
	mf, _ = Modelfile("m.gguf", "m.Modelfile", ChatML, nil, "")
	want = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n" +
		"<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n"
	if got := render(t, mf, map[string]any{"Messages": conv}); got != want || !strings.Contains(mf, `PARAMETER stop "<|im_end|>"`) {
		t.Errorf("chatml\n got %q\nwant %q", got, want)
	}
	mf, _ = Modelfile("m.gguf", "m.Modelfile", Alpaca, nil, "")
	for _, system := range []string{"", "You are terse."} {
		want := tokenizer.AlpacaSystemPrompt(system, "Name a color.", "")
		if got := render(t, mf, map[string]any{"System": system, "Prompt": "Name a color.", "Response": ""}); got != want {
			t.Errorf("alpaca (system %q)\n got %q\nwant %q", system, got, want)
		}
	}
	mf, ok = Modelfile("m.gguf", "m.Modelfile", "", []string{"</s>"}, "the model was exported without a tokenizer")
	if ok || strings.Contains(mf, "\nTEMPLATE") || !strings.Contains(mf, "# No TEMPLATE: the model was exported without a tokenizer") {
		t.Errorf("untranslatable template:\n%s", mf)
	}
}

// TestTranslate: the real models' templates (chattemplate's fixtures) translate to the Ollama format that
// renders as they do, checked on probe conversations by Translate itself and here on one more conversation;
// Mistral-Nemo's (the system message folded into the last user turn) has no translation and says so.
func TestTranslate(t *testing.T) {
	want := map[string]string{
		"qwen2.5-7b-instruct.jinja": ChatML, "qwen3-0.6b.jinja": ChatML, "gemma-2-2b-it.jinja": Gemma,
		"phi-3.5-mini-instruct.jinja": Phi3, "mistral-7b-instruct-v0.3.jinja": Mistral, "llama-3.1-8b-instruct.jinja": "",
		"mistral-nemo-instruct-2407.jinja": "",
	}
	bos := map[string]string{"gemma-2-2b-it.jinja": "<bos>", "mistral-7b-instruct-v0.3.jinja": "<s>", "mistral-nemo-instruct-2407.jinja": "<s>",
		"llama-3.1-8b-instruct.jinja": "<|begin_of_text|>", "phi-3.5-mini-instruct.jinja": "<s>"}
	for file, format := range want {
		src, err := os.ReadFile(filepath.Join("..", "..", "chattemplate", "testdata", "templates", file))
		if err != nil {
			t.Fatal(err)
		}
		tok := &tokenizer.Tokenizer{Config: tokenizer.Config{BOSToken: bos[file], EOSToken: "</s>"}}
		tmpl, err := chattemplate.New(string(src), file, tok)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := Translate(tmpl.Render, bos[file])
		if format == "" {
			if err == nil {
				t.Errorf("%s translated to %s", file, tr.Format)
			}
			continue
		}
		if err != nil || tr.Format != format {
			t.Errorf("%s: %v, %q; want %s", file, err, tr.Format, format)
			continue
		}
		conv := []tokenizer.Message{{Role: "user", Content: "What is 2+2?"}, {Role: "assistant", Content: "4"}, {Role: "user", Content: "And 3+3?"}}
		jinja, err := tmpl.Render(conv, true)
		if err != nil {
			t.Fatal(err)
		}
		mf := ModelfileOf("m.gguf", "m.Modelfile", tr, nil, "")
		if got := render(t, mf, map[string]any{"Messages": conv}); got != strings.TrimPrefix(jinja, bos[file]) {
			t.Errorf("%s as %s:\n got %q\nwant %q", file, format, got, jinja)
		}
	}
}
