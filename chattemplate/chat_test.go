package chattemplate_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/tokenizer"
)

// TestWhereTheTemplateComesFrom: tokenizer_config.json's chat_template as a string, as a list of named
// templates (the one named "default" is rendered; without one, auto falls back to Alpaca naming the templates
// and model is refused), and chat_template.jinja beside it, which wins; without any, auto takes Alpaca and says
// why, model is refused. Each choice names where its template came from.
func TestWhereTheTemplateComesFrom(t *testing.T) {
	tj, err := os.ReadFile(filepath.Join("..", "pretrained", "llama-tiny", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	const chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}\n"
	const other = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
	load := func(config map[string]any, jinjaFile string) *tokenizer.Tokenizer {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644)
		b, _ := json.Marshal(config)
		os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), b, 0o644)
		if jinjaFile != "" {
			os.WriteFile(filepath.Join(dir, tokenizer.ChatTemplateFile), []byte(jinjaFile), 0o644)
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	msgs := []tokenizer.Message{{Role: "user", Content: "Hi"}}
	render := func(tok *tokenizer.Tokenizer, choice string) (*chattemplate.Chat, string) {
		c, err := chattemplate.Resolve(tok, choice)
		if err != nil {
			t.Fatalf("%s: %v", choice, err)
		}
		_, text, err := c.EncodePrompt(msgs)
		if err != nil {
			t.Fatal(err)
		}
		return c, text
	}
	// a string
	tok := load(map[string]any{"chat_template": chatml}, "")
	if c, text := render(tok, "auto"); c.String() != "model (tokenizer_config.json)" || text != "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n" || c.Note != "" {
		t.Errorf("string template: %s, %q, note %q", c, text, c.Note)
	}
	// named templates with a default, and chat_template.jinja over them
	named := []map[string]string{{"name": "tool_use", "template": other}, {"name": "default", "template": chatml}}
	tok = load(map[string]any{"chat_template": named}, "")
	if c, _ := render(tok, "model"); !strings.Contains(c.String(), `"default" of 2 named templates`) {
		t.Errorf("named templates: %s", c)
	}
	tok = load(map[string]any{"chat_template": named}, other)
	if c, text := render(tok, "auto"); c.String() != "model (chat_template.jinja; tokenizer_config.json's different chat_template is not used, as in transformers)" || text != "[user] Hi\n" {
		t.Errorf("chat_template.jinja: %s, %q", c, text)
	}
	// named templates without a default; no template at all
	for _, cfg := range []map[string]any{{"chat_template": named[:1]}, {}} {
		tok = load(cfg, "")
		c, err := chattemplate.Resolve(tok, "auto")
		if err != nil || c.Name != chattemplate.Alpaca || !strings.Contains(c.Note, "conversations take memfit's Alpaca prompt") {
			t.Errorf("%v: auto gives %v, %v", cfg, c, err)
		}
		if len(cfg) > 0 && !strings.Contains(c.Note, "tool_use") {
			t.Errorf("the note does not name the templates: %q", c.Note)
		}
		if _, err := chattemplate.Resolve(tok, "model"); err == nil {
			t.Errorf("%v: model resolved", cfg)
		}
	}
	// a template that does not parse, and a malformed chat_template
	tok = load(map[string]any{"chat_template": "{% for m in messages %}"}, "")
	if _, err := chattemplate.Resolve(tok, "auto"); err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Errorf("unparsable template: %v", err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"chat_template": 3}`), 0o644)
	if _, err := tokenizer.Load(dir); err == nil || !strings.Contains(err.Error(), "chat_template") {
		t.Errorf("a chat_template that is a number: %v", err)
	}
}

// TestTurnErrors: a template that leaves the assistant's content out cannot be trained on (memfit would not
// know what to learn), and a conversation without an assistant turn has nothing to learn; both say so.
func TestTurnErrors(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join("..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chattemplate.New("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% else %}(reply){% endif %}\n{% endfor %}", "test", tok)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.Encode(tok, []tokenizer.Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello"}}); err == nil || !strings.Contains(err.Error(), "does not render the assistant's content") {
		t.Errorf("a template without the assistant's content: %v", err)
	}
	tok.Config.ChatTemplate, tok.Config.ChatTemplateFrom = "{% for m in messages %}{{ m.content }}<|end_of_text|>{% endfor %}", "test"
	c, err := chattemplate.Resolve(tok, "model")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.EncodeTraining([]tokenizer.Message{{Role: "user", Content: "Hi"}}); err == nil || !strings.Contains(err.Error(), "no assistant turn") {
		t.Errorf("no assistant turn: %v", err)
	}
	ids, labels, unended, err := c.EncodeTraining([]tokenizer.Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello"}})
	if err != nil || unended != 0 || tok.Decode(learned(ids, labels), false) != "Hello<|end_of_text|>" {
		t.Errorf("learned %q (unended %d, %v), want the reply and its EOS", tok.Decode(learned(ids, labels), false), unended, err)
	}
}

func learned(ids, labels []int) []int {
	var out []int
	for i, l := range labels {
		if l != tokenizer.IgnoreIndex {
			out = append(out, ids[i])
		}
	}
	return out
}
