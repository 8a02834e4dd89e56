package chattemplate_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/npmtool"
	"github.com/memfit/memfit/internal/tokentest"
	"github.com/memfit/memfit/tokenizer"
)

// fixture is a model's chat template in testdata/templates (README.md there cites each one's source) with the
// special tokens of its tokenizer_config.json.
type fixture struct {
	file     string
	base     string            // the shared tokenizer the test tokenizer is made from (llama3: byte-level BPE; mistral: SentencePiece-style)
	special  map[string]string // tokenizer_config.json's special tokens
	added    []string          // special tokens added to the base tokenizer
	header   string            // what precedes an assistant turn's content (the independent mask check)
	end      string            // what follows it and is learned: the end of the turn
	trim     bool              // the template trims contents
	marked   bool              // the template has {% generation %} blocks: they hold the header and the end
	noSystem bool              // the template refuses a system message
}

var fixtures = []fixture{
	{file: "qwen2.5-7b-instruct.jinja", base: "llama3", special: map[string]string{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
		added: []string{"<|im_start|>", "<|im_end|>", "<|endoftext|>"}, header: "<|im_start|>assistant\n", end: "<|im_end|>"},
	{file: "qwen3-0.6b.jinja", base: "llama3", special: map[string]string{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
		added: []string{"<|im_start|>", "<|im_end|>", "<|endoftext|>"}, header: "<|im_start|>assistant\n", end: "<|im_end|>"},
	{file: "llama-3.1-8b-instruct.jinja", base: "llama3", special: map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
		header: "<|start_header_id|>assistant<|end_header_id|>\n\n", end: "<|eot_id|>", trim: true},
	{file: "gemma-2-2b-it.jinja", base: "mistral", special: map[string]string{"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
		added: []string{"<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"}, header: "<start_of_turn>model\n", end: "<end_of_turn>", trim: true, noSystem: true},
	{file: "phi-3.5-mini-instruct.jinja", base: "mistral", special: map[string]string{"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>"},
		added: []string{"<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"}, header: "<|assistant|>\n", end: "<|end|>"},
	{file: "mistral-7b-instruct-v0.3.jinja", base: "mistral", special: map[string]string{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
		added: []string{"[INST]", "[/INST]"}, header: "[/INST] ", end: " </s>"},
	{file: "mistral-nemo-instruct-2407.jinja", base: "mistral", special: map[string]string{"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
		added: []string{"[INST]", "[/INST]"}, header: "[/INST]", end: "</s>"},
	{file: "smollm3-3b.jinja", base: "llama3", special: map[string]string{"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"},
		added: []string{"<|im_start|>", "<|im_end|>"}, header: "<|im_start|>assistant\n", end: "<|im_end|>\n", marked: true},
}

type message = tokenizer.Message

// conversations are rendered with every template, with and without the generation prompt: a single user turn,
// a system prompt, one exchange, multi-turn with system, whitespace, quotes, Jinja-looking text, non-ASCII and
// emoji, and a conversation ending with the user after several turns.
var conversations = [][]message{
	{{Role: "user", Content: "Hello, how are you?"}},
	{{Role: "system", Content: "You are a terse assistant."}, {Role: "user", Content: "Name a prime number."}},
	{{Role: "user", Content: "What is 2+2?"}, {Role: "assistant", Content: "4"}},
	{{Role: "system", Content: "  Answer in French.\n"}, {Role: "user", Content: "Hi!"}, {Role: "assistant", Content: " Bonjour ! "},
		{Role: "user", Content: "How do you say \"cat\"? {{ not a tag }} {% nor this %}"}, {Role: "assistant", Content: "« chat » — 猫 😀\nline two"}},
	{{Role: "user", Content: "a"}, {Role: "assistant", Content: "b"}, {Role: "user", Content: "c\n\n"}},
	{{Role: "user", Content: "List two colours."}, {Role: "assistant", Content: "Red\nand blue."}, {Role: "user", Content: "One more?"},
		{Role: "assistant", Content: "Green."}},
}

// fixedNow is the clock both sides' strftime_now read.
var fixedNow = time.Date(2025, 7, 10, 12, 0, 0, 0, time.Local)

// baseTokenizers are the shared llama3 and mistral tokenizers with every fixture's special tokens added (each
// one token, as in the models' own vocabularies), loaded once.
var baseTokenizers = map[string]*tokenizer.Tokenizer{}

// testTokenizer returns the fixture's tokenizer: its base with the fixture's special tokens and chat template
// as its tokenizer_config.json would give them.
func testTokenizer(t *testing.T, f fixture) *tokenizer.Tokenizer {
	t.Helper()
	base := baseTokenizers[f.base]
	if base == nil {
		base = loadBase(t, f.base)
		baseTokenizers[f.base] = base
	}
	src, err := os.ReadFile(filepath.Join("testdata", "templates", f.file))
	if err != nil {
		t.Fatal(err)
	}
	tok := *base
	c := &tok.Config
	c.ChatTemplate, c.ChatTemplateFrom = string(src), f.file
	c.BOSToken, c.EOSToken, c.PadToken, c.UnkToken = f.special["bos_token"], f.special["eos_token"], f.special["pad_token"], f.special["unk_token"]
	return &tok
}

// loadBase writes the shared tokenizer.json with every fixture's special tokens of that base added and loads it.
func loadBase(t *testing.T, name string) *tokenizer.Tokenizer {
	raw, err := os.ReadFile(filepath.Join(golden.SharedDir(t), "tokenizers", name, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj map[string]any
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	added := tj["added_tokens"].([]any)
	next := 0
	have := map[string]bool{}
	for _, a := range added {
		next = max(next, int(a.(map[string]any)["id"].(float64))+1)
		have[a.(map[string]any)["content"].(string)] = true
	}
	next = max(next, len(tj["model"].(map[string]any)["vocab"].(map[string]any)))
	for _, f := range fixtures {
		for _, s := range f.added {
			if f.base != name || have[s] {
				continue
			}
			have[s] = true
			added = append(added, map[string]any{"id": next, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
			next++
		}
	}
	tj["added_tokens"] = added
	dir := t.TempDir()
	b, _ := json.Marshal(tj)
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// hfJinja renders cases with @huggingface/jinja (tools/chattemplate/render.mjs, installed into memfit's npm
// tool cache on first use: internal/npmtool); the test skips, saying why, only where node or npm is missing.
type hfCase struct {
	Template string         `json:"template"`
	Vars     map[string]any `json:"vars"`
	Now      string         `json:"now,omitempty"`
}

type hfResult struct {
	Text  *string `json:"text"`
	Error string  `json:"error"`
}

func hfJinja(t *testing.T, cases []hfCase) []hfResult {
	t.Helper()
	tool, err := npmtool.Install(filepath.Join("..", "tools", "chattemplate"), testLog{t})
	if errors.Is(err, npmtool.ErrNoNode) {
		t.Skipf("@huggingface/jinja check skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	req, _ := json.Marshal(map[string]any{"cases": cases})
	cmd := exec.Command(tool.Node, tool.Script("render.mjs"))
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node render.mjs: %v: %s", err, stderr.String())
	}
	var res struct {
		Results []hfResult `json:"results"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Results) != len(cases) {
		t.Fatalf("render.mjs answered %d results for %d cases (%v)", len(res.Results), len(cases), err)
	}
	return res.Results
}

// testLog tells the test log when npm installs @huggingface/jinja.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// vars are the variables memfit passes a template (Template.Render), for @huggingface/jinja.
func vars(tok *tokenizer.Tokenizer, msgs []message, addGenerationPrompt bool) map[string]any {
	v := map[string]any{"messages": msgs, "add_generation_prompt": addGenerationPrompt, "tools": nil, "documents": nil}
	c := tok.Config
	for name, s := range map[string]string{"bos_token": c.BOSToken, "eos_token": c.EOSToken, "unk_token": c.UnkToken,
		"pad_token": c.PadToken, "sep_token": c.SepToken, "cls_token": c.ClsToken, "mask_token": c.MaskToken} {
		if s != "" {
			v[name] = s
		}
	}
	return v
}

// TestRenderingMatchesHuggingFaceJinja: every fixture template (the Qwen2.5, Qwen3, Llama-3.1, Gemma 2, Phi-3.5,
// Mistral v0.3 and Mistral-Nemo templates as their models ship them, SmolLM3's with generation blocks) and the
// shared Llama-3 tokenizer's own template render every conversation, with and without the generation prompt,
// byte for byte as @huggingface/jinja (the Jinja port transformers.js uses) renders them; where the template
// refuses a conversation (Gemma's system message) both refuse it, memfit with the template's own message.
func TestRenderingMatchesHuggingFaceJinja(t *testing.T) {
	defer chattemplate.SetNow(func() time.Time { return fixedNow })()
	type item struct {
		name string
		tmpl *chattemplate.Template
		msgs []message
		agp  bool
	}
	var items []item
	var cases []hfCase
	add := func(name string, tok *tokenizer.Tokenizer) {
		tmpl, err := chattemplate.FromTokenizer(tok)
		if err != nil {
			t.Fatal(err)
		}
		for _, msgs := range conversations {
			for _, agp := range []bool{false, true} {
				items = append(items, item{name, tmpl, msgs, agp})
				cases = append(cases, hfCase{Template: tok.Config.ChatTemplate, Vars: vars(tok, msgs, agp), Now: fixedNow.Format("2006-01-02T15:04:05")})
			}
		}
	}
	for _, f := range fixtures {
		add(f.file, testTokenizer(t, f))
	}
	shipped, err := tokenizer.Load(filepath.Join(golden.SharedDir(t), "tokenizers", "llama3"))
	if err != nil {
		t.Fatal(err)
	}
	add("shared llama3 tokenizer", shipped)
	results := hfJinja(t, cases)
	refused := 0
	for i, it := range items {
		got, err := it.tmpl.Render(it.msgs, it.agp)
		want := results[i]
		switch {
		case want.Text == nil:
			var raised *chattemplate.RaisedError
			if err == nil || !errors.As(err, &raised) || raised.Message != want.Error {
				t.Errorf("%s, conversation %d, add_generation_prompt=%v: @huggingface/jinja refuses it (%q), memfit: %q, %v", it.name, i/2%len(conversations), it.agp, want.Error, got, err)
			}
			refused++
		case err != nil:
			t.Errorf("%s, conversation %d: %v (@huggingface/jinja renders %q)", it.name, i/2%len(conversations), err, *want.Text)
		case got != *want.Text && !hfJinjaLstripBug(it.name, got, *want.Text):
			t.Errorf("%s, conversation %d, add_generation_prompt=%v:\n memfit            %q\n @huggingface/jinja %q", it.name, i/2%len(conversations), it.agp, got, *want.Text)
		}
	}
	if refused == 0 || refused > len(items)/4 {
		t.Errorf("%d of %d renderings refused: want Gemma's system conversations only", refused, len(items))
	}
	t.Logf("%d renderings equal to @huggingface/jinja's (%d refused by both)", len(items)-refused, refused)
}

// hfJinjaLstripBug: @huggingface/jinja 0.5.11's str.lstrip(chars) and str.strip(chars) ignore chars and strip
// all whitespace; Python's (transformers renders with Python's Jinja2) strip only chars. SmolLM3's template
// writes content.lstrip("\n"), so for a reply that starts with a space memfit keeps the space as Python does
// (checked against Jinja2 3.1.6) and @huggingface/jinja drops it. This reports exactly that difference.
func hfJinjaLstripBug(name, got, want string) bool {
	return name == "smollm3-3b.jinja" && strings.Contains(got, "assistant\n Bonjour") &&
		strings.Replace(got, "assistant\n Bonjour", "assistant\nBonjour", 1) == want
}

// TestAssistantMask: the labels Encode gives each fixture's conversations, checked token by token against an
// independent computation: the assistant's text found in the rendering by the template's known layout (its
// header before the content as the template writes it, trimmed or not, and its end of turn after), and each
// token's bytes found by decoding the tokens one by one. A token is learned exactly when it overlaps that
// text. With generation blocks (SmolLM3) the learned text is the block: header, content and end.
func TestAssistantMask(t *testing.T) {
	defer chattemplate.SetNow(func() time.Time { return fixedNow })()
	for _, f := range fixtures {
		tok := testTokenizer(t, f)
		tmpl, err := chattemplate.FromTokenizer(tok)
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for ci, msgs := range conversations {
			if f.noSystem && msgs[0].Role == "system" {
				continue
			}
			e, err := tmpl.Encode(tok, msgs)
			if err != nil {
				if len(msgs)%2 == 1 && strings.HasPrefix(f.file, "gemma") {
					continue
				}
				t.Fatalf("%s conversation %d: %v", f.file, ci, err)
			}
			text, err := tmpl.Render(msgs, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := tok.Decode(e.IDs, false); got != strings.TrimPrefix(text, " ") && !strings.HasSuffix(f.base, "mistral") {
				t.Fatalf("%s: the encoding decodes to %q, not the rendering %q", f.file, got, text)
			}
			// the learned text, by the template's layout
			var spans [][2]int
			from := 0
			for _, m := range msgs {
				if m.Role != "assistant" {
					continue
				}
				content := m.Content
				if f.trim {
					content = strings.TrimSpace(content)
				}
				h := strings.Index(text[from:], f.header)
				if h < 0 {
					t.Fatalf("%s: no assistant header after byte %d of %q", f.file, from, text)
				}
				h += from + len(f.header)
				c := strings.Index(text[h:], content)
				if c < 0 {
					t.Fatalf("%s: the content %q does not follow the header in %q", f.file, content, text)
				}
				c += h
				end := c + len(content)
				if !strings.HasPrefix(text[end:], f.end) {
					t.Fatalf("%s: %q does not follow the content in %q", f.file, f.end, text)
				}
				start := c
				if f.marked {
					start = h - len(f.header)
				}
				spans = append(spans, [2]int{start, end + len(f.end)})
				from = end + len(f.end)
			}
			starts, ends := tokentest.DecodedOffsets(t, tok, e.IDs, text)
			for j, id := range e.IDs {
				want := false
				for _, s := range spans {
					if starts[j] < s[1] && ends[j] > s[0] {
						want = true
					}
				}
				if got := e.Labels[j] != tokenizer.IgnoreIndex; got != want {
					t.Fatalf("%s conversation %d token %d (%q at bytes %d-%d of %q): learned %v, want %v (assistant text at %v)",
						f.file, ci, j, tok.Decode([]int{id}, false), starts[j], ends[j], text, got, want, spans)
				}
				if e.Labels[j] != tokenizer.IgnoreIndex && e.Labels[j] != id {
					t.Fatalf("%s: label %d at token %d, want its id %d", f.file, e.Labels[j], j, id)
				}
			}
			checked++
		}
		if checked < 3 {
			t.Errorf("%s: %d conversations checked", f.file, checked)
		}
	}
}
