package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

func loadShared(t *testing.T, name string) *Tokenizer {
	t.Helper()
	tok, err := Load(filepath.Join(golden.SharedDir(t), "tokenizers", name))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestEncodeBatch(t *testing.T) {
	tok := loadShared(t, "mistral")
	texts := []string{"Hello world", "I believe the meaning of life is", ""}
	b, err := tok.EncodeBatch(texts, BatchOptions{AddSpecial: true, MaxLength: 5, PadSide: Left})
	if err != nil {
		t.Fatal(err)
	}
	full := tok.Encode(texts[1], true)
	want := [][]int{{0, 0, 1, 22557, 1526}, full[:5], {0, 0, 0, 0, 1}}
	if !reflect.DeepEqual(b.IDs, want) {
		t.Errorf("ids %v, want %v", b.IDs, want)
	}
	if !reflect.DeepEqual(b.AttentionMask, [][]int{{0, 0, 1, 1, 1}, {1, 1, 1, 1, 1}, {0, 0, 0, 0, 1}}) {
		t.Errorf("mask %v", b.AttentionMask)
	}
	b, _ = tok.EncodeBatch(texts[:2], BatchOptions{AddSpecial: true, MaxLength: 4, Truncation: Left, PadToMax: true})
	if !reflect.DeepEqual(b.IDs[1], full[len(full)-4:]) || len(b.IDs[0]) != 4 || !reflect.DeepEqual(b.AttentionMask[0], []int{1, 1, 1, 0}) {
		t.Errorf("left truncation / right padding: %v %v", b.IDs, b.AttentionMask)
	}
	if _, err := tok.EncodeBatch(texts, BatchOptions{PadToMax: true}); err == nil {
		t.Error("PadToMax without MaxLength accepted")
	}
}

func TestFormatInstruction(t *testing.T) {
	tok := loadShared(t, "mistral")
	ids, labels := tok.FormatInstruction("Name a colour.", "", "Blue.")
	if len(ids) != len(labels) {
		t.Fatalf("%d ids, %d labels", len(ids), len(labels))
	}
	prompt := tok.Encode(AlpacaPrompt("Name a colour.", ""), true)
	for i := range prompt {
		if labels[i] != IgnoreIndex {
			t.Fatalf("prompt token %d is learned", i)
		}
	}
	var learned []int
	for _, l := range labels[len(prompt):] {
		if l == IgnoreIndex {
			t.Fatal("a response token is masked")
		}
		learned = append(learned, l)
	}
	if eos, _ := tok.EOS(); learned[len(learned)-1] != eos {
		t.Errorf("the response does not end with EOS: %v", learned)
	}
	if got := tok.Decode(learned, true); got != "Blue." {
		t.Errorf("learned tokens decode to %q", got)
	}
	if !strings.Contains(AlpacaPrompt("x", "y"), "### Input:\ny\n\n### Response:\n") {
		t.Error("the prompt with input lacks its input section")
	}
}

func TestFormatChatLlama3(t *testing.T) {
	tok := loadShared(t, "llama3")
	if tok.ChatFormat() != ChatLlama3 {
		t.Fatalf("chat format %q", tok.ChatFormat())
	}
	msgs := []Message{{"system", "Be brief."}, {"user", " Hi! "}, {"assistant", "Hello."}}
	ids, labels, err := tok.FormatChat(msgs, "", false)
	if err != nil {
		t.Fatal(err)
	}
	// The chat template's rendering (trimmed contents, BOS first), encoded as one string.
	rendered := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
	if want := tok.Encode(rendered, false); !reflect.DeepEqual(ids, want) {
		t.Errorf("ids %v\nwant %v", ids, want)
	}
	var learned []int
	for _, l := range labels {
		if l != IgnoreIndex {
			learned = append(learned, l)
		}
	}
	if got := tok.Decode(learned, false); got != "Hello.<|eot_id|>" {
		t.Errorf("learned %q", got)
	}
	if _, _, err := loadShared(t, "bert-base-uncased").FormatChat(msgs, "", false); err == nil {
		t.Error("BERT has no chat template, yet FormatChat rendered one")
	}
}

// conversation is a system message and two user turns around an assistant reply, with the spaces and newlines
// that show where a template trims.
var conversation = []Message{{"system", "Be brief."}, {"user", " Hi! "}, {"assistant", "Hello."}, {"user", "Name a colour.\n"}}

// TestFormatChatEveryTurn: Llama-3 and ChatML render the system message and every turn in order, ending with
// the assistant's header, exactly as the Hugging Face templates do: the expected strings are the jinja2
// renderings (add_generation_prompt=True) of the Llama-3 template in ../shared/data/tokenizers/llama3 and of the
// ChatML template, encoded as one string without added special tokens (apply_chat_template's tokenization).
func TestFormatChatEveryTurn(t *testing.T) {
	l3 := loadShared(t, "llama3")
	rendered := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	ids, _, err := l3.FormatChat(conversation, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if want := l3.Encode(rendered, false); !reflect.DeepEqual(ids, want) {
		t.Errorf("Llama-3: %q\nwant %q", l3.Decode(ids, false), rendered)
	}
	if l3.MissingChatTokens(ChatLlama3) != nil {
		t.Errorf("the Llama-3 tokenizer lacks %v", l3.MissingChatTokens(ChatLlama3))
	}

	// No tokenizer in ../shared has a ChatML template: the Llama-3 one with two reserved special tokens renamed
	// <|im_start|> and <|im_end|>, and the ChatML template in its tokenizer_config.json.
	chatml := chatMLTokenizer(t)
	if chatml.ChatFormat() != ChatML {
		t.Fatalf("chat format %q", chatml.ChatFormat())
	}
	rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi! <|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n" +
		"<|im_start|>user\nName a colour.\n<|im_end|>\n<|im_start|>assistant\n"
	ids, labels, err := chatml.FormatChat(conversation, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if want := chatml.Encode(rendered, false); !reflect.DeepEqual(ids, want) {
		t.Errorf("ChatML: %q\nwant %q", chatml.Decode(ids, false), rendered)
	}
	var learned []int
	for _, l := range labels {
		if l != IgnoreIndex {
			learned = append(learned, l)
		}
	}
	if got := chatml.Decode(learned, false); got != "Hello.<|im_end|>" {
		t.Errorf("ChatML learned %q", got)
	}
}

func chatMLTokenizer(t *testing.T) *Tokenizer {
	t.Helper()
	src := filepath.Join(golden.SharedDir(t), "tokenizers", "llama3")
	raw, err := os.ReadFile(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(raw), "<|reserved_special_token_0|>", "<|im_start|>")
	s = strings.ReplaceAll(s, "<|reserved_special_token_1|>", "<|im_end|>")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(s), 0o644)
	cfg, _ := json.Marshal(map[string]any{"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>",
		"chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"})
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644)
	tok, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestChatTokensChecked: a chat format on a tokenizer without its special tokens is refused naming them (the
// markup was encoded as text, so the model never saw its template nor produced its end of turn).
func TestChatTokensChecked(t *testing.T) {
	tiny, err := Load(filepath.Join("..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tok    *Tokenizer
		format string
		want   string
	}{
		{tiny, ChatLlama3, "lacks: <|start_header_id|>, <|end_header_id|>, <|eot_id|> ("}, // it has <|begin_of_text|>
		{tiny, ChatML, "lacks: <|im_start|>, <|im_end|> ("},
		{loadShared(t, "mistral"), ChatLlama3, "lacks: <|begin_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|> ("},
		{loadShared(t, "llama3"), ChatML, "lacks: <|im_start|>, <|im_end|> ("},
	} {
		_, _, err := c.tok.FormatChat(conversation, c.format, true)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s on %s: %v; want an error naming %q", c.format, c.tok.Path, err, c.want)
		}
	}
}

// TestAlpacaConversation: a conversation in the Alpaca prompt: one user message is the training prompt
// exactly; a system message takes the preamble's place; earlier turns are the input, in order; what the prompt
// has no place for is refused.
func TestAlpacaConversation(t *testing.T) {
	one, err := AlpacaConversation([]Message{{"user", "Name a colour."}})
	if err != nil || one != AlpacaPrompt("Name a colour.", "") {
		t.Errorf("one user message: %q, %v", one, err)
	}
	got, err := AlpacaConversation(conversation)
	want := "Be brief.\n\n### Instruction:\nName a colour.\n\n\n### Input:\nUser:  Hi! \nAssistant: Hello.\n\n### Response:\n"
	if err != nil || got != want {
		t.Errorf("conversation: %q, %v\nwant %q", got, err, want)
	}
	got, _ = AlpacaConversation(conversation[1:])
	if want := AlpacaPrompt("Name a colour.\n", "User:  Hi! \nAssistant: Hello."); got != want {
		t.Errorf("without a system message: %q, want %q", got, want)
	}
	if got, _ := AlpacaConversation([]Message{{"system", "Be brief."}, {"user", "Hi"}}); got != "Be brief.\n\n### Instruction:\nHi\n\n### Response:\n" {
		t.Errorf("system and one turn: %q", got)
	}
	for _, c := range []struct {
		msgs []Message
		want string
	}{
		{conversation[:3], "ends with a user message"},
		{nil, "ends with a user message"},
		{[]Message{{"system", "x"}}, "ends with a user message"},
		{[]Message{{"user", "a"}, {"system", "x"}, {"user", "b"}}, "only as the first message"},
		{[]Message{{"tool", "a"}, {"user", "b"}}, `role "tool"`},
	} {
		if _, err := AlpacaConversation(c.msgs); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.msgs, err, c.want)
		}
	}
}
