// Package generate turns what a user asks into token ids for runner.Generator and its tokens back into text:
// prompt files (plain prompts, Alpaca instructions, chat conversations), the chat template (the model's own
// Jinja template, or memfit's Llama-3, ChatML or Alpaca: chattemplate.Chat), the tokens that end a reply, and a
// streamer that prints text as tokens arrive. The decoding itself (key/value cache, sampling) is
// runner.Generator's.
package generate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/tokenizer"
)

// Chat templates (chattemplate.Choices): the model's own (its tokenizer's Jinja chat_template), memfit's
// built-in Llama-3 and ChatML, and the Stanford Alpaca prompt that memfit's instruction fine-tuning trains on
// (AlpacaPrompt).
const (
	TemplateAuto   = chattemplate.Auto // the model's own template when its tokenizer has one, else Alpaca
	TemplateModel  = chattemplate.Model
	TemplateLlama3 = chattemplate.Llama3
	TemplateChatML = chattemplate.ChatML
	TemplateAlpaca = chattemplate.Alpaca
)

// Templates lists the values of a template choice.
var Templates = chattemplate.Choices

// Prompt is one request: a plain text (continued as it is), an Alpaca instruction with optional input, or a
// conversation. Prompt files hold one JSON object per line with these keys.
type Prompt struct {
	// Prompt is a plain text; with chat formatting it is the user's turn.
	Prompt string `json:"prompt,omitempty"`
	// Instruction and Input are an Alpaca row's (formatted with the Alpaca prompt, as training formats them).
	Instruction string `json:"instruction,omitempty"`
	Input       string `json:"input,omitempty"`
	// Messages is a conversation (rendered with the chat template, ending with the assistant's header): every
	// turn, in order.
	Messages []tokenizer.Message `json:"messages,omitempty"`
	// System is a system message: the first turn of a conversation or of a chat-formatted prompt, and under the
	// Alpaca prompt the text in place of its preamble (tokenizer.AlpacaSystemPrompt). A plain prompt continued
	// as it is has no place for one.
	System string `json:"system,omitempty"`
	// Line is the prompt's line in the file ReadPrompts read it from (0 otherwise), for messages.
	Line int `json:"-"`
}

// samplingKeys are keys of other tools' prompt files (OpenAI-style requests, vLLM, transformers' generation
// config) that set sampling per prompt; memfit reads none of them, and says so.
var samplingKeys = []string{"temperature", "top_p", "top_k", "seed", "stop", "max_tokens", "max_new_tokens",
	"do_sample", "n", "repetition_penalty", "min_p", "typical_p"}

// ReadPrompts reads a JSONL prompt file: one Prompt object per non-blank line. A line that is not one JSON object
// of Prompt's keys (two objects, or anything after the object, included), that sets per-prompt sampling (memfit
// reads none: the flags apply to every prompt) or that is longer than data.MaxLineBytes is an error naming the
// file and line.
func ReadPrompts(path string) ([]Prompt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readPrompts(f, path)
}

func readPrompts(r io.Reader, name string) ([]Prompt, error) {
	var out []Prompt
	err := data.EachLineOf(r, name, func(line int, text string) error {
		if text = strings.TrimSpace(text); text == "" {
			return nil
		}
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		var p Prompt
		if err := dec.Decode(&p); err != nil {
			var keys map[string]json.RawMessage
			if json.Unmarshal([]byte(text), &keys) == nil {
				for _, k := range samplingKeys {
					if _, ok := keys[k]; ok {
						return fmt.Errorf("%s:%d: %q: memfit reads no per-prompt sampling settings from a prompt file: give --temperature, --top-k, --top-p, --seed, --stop or --max-new-tokens, which apply to every prompt", name, line, k)
					}
				}
			}
			return fmt.Errorf("%s:%d: %v (each line is a JSON object with prompt, instruction/input or messages, and optionally system)", name, line, err)
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return fmt.Errorf("%s:%d: trailing data after the JSON object (one JSON object per line)", name, line)
		}
		if err := p.check(); err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
		p.Line = line
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no prompts", name)
	}
	return out, nil
}

func (p Prompt) check() error {
	n := 0
	for _, set := range []bool{p.Prompt != "", p.Instruction != "", len(p.Messages) > 0} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("give exactly one of prompt, instruction (with optional input) or messages")
	}
	if p.Input != "" && p.Instruction == "" {
		return errors.New("input needs an instruction")
	}
	for _, m := range p.Messages {
		switch m.Role {
		case "system", "user", "assistant":
		default:
			return fmt.Errorf("message role %q: use system, user or assistant", m.Role)
		}
	}
	if p.System != "" && p.HasSystemMessage() {
		return errors.New(`give the system message once: in "system" or as the first message`)
	}
	return nil
}

// HasSystemMessage reports whether the conversation starts with a system message of its own.
func (p Prompt) HasSystemMessage() bool {
	return len(p.Messages) > 0 && p.Messages[0].Role == "system"
}

// Formatter encodes prompts for a model's tokenizer.
type Formatter struct {
	Tok *tokenizer.Tokenizer
	// Chat formats plain prompts as a user's turn of a conversation (with the template); without it they are
	// continued as they are. Instructions always take the Alpaca prompt, conversations the chat template.
	Chat bool
	// Template is one of Templates ("" is auto).
	Template string
}

// Resolve returns the chat template that applies (chattemplate.Resolve): Template, or for auto the model's own
// when its tokenizer has one, else Alpaca (saying so in the Chat's Note). A Llama-3 or ChatML template with a
// tokenizer that lacks its special tokens is an error naming them (tokenizer.CheckChatFormat): its markup
// would be encoded as plain text; so is a model template that does not parse.
func (f Formatter) Resolve() (*chattemplate.Chat, error) {
	return chattemplate.Resolve(f.Tok, f.Template)
}

// Resolved returns the name of the template that applies (Resolve): model, llama3, chatml or alpaca.
func (f Formatter) Resolved() (string, error) {
	c, err := f.Resolve()
	if err != nil {
		return "", err
	}
	return c.Name, nil
}

// UsesTemplate reports whether p is rendered with the chat template (a conversation, or a plain prompt with
// Chat), rather than the Alpaca instruction prompt or as it is.
func (f Formatter) UsesTemplate(p Prompt) bool {
	return len(p.Messages) > 0 || (p.Prompt != "" && f.Chat)
}

// Encode returns the token ids of p, ready to be continued, and the text they render (for display).
//
// An instruction takes the Alpaca prompt as training formats it (a system message in place of its preamble). A
// plain prompt without Chat is continued as it is (a system message is refused: it has no place there). A
// conversation, or a plain prompt with Chat as the user's turn, takes the chat template with the system message
// first (chattemplate.Chat.EncodePrompt): the model's own template renders it as apply_chat_template with
// add_generation_prompt does; Llama-3 and ChatML render every turn in order as the Hugging Face templates do
// (tokenizer.FormatChat); Alpaca renders it with tokenizer.AlpacaConversation (the last user message the
// instruction, the turns before it the input), and refuses a conversation it cannot render.
func (f Formatter) Encode(p Prompt) ([]int, string, error) {
	if err := p.check(); err != nil {
		return nil, "", err
	}
	if f.Template != "" && !slices.Contains(Templates, f.Template) {
		return nil, "", fmt.Errorf("unknown chat template %q: use one of %s", f.Template, strings.Join(Templates, ", "))
	}
	switch {
	case p.Instruction != "":
		text := tokenizer.AlpacaSystemPrompt(p.System, p.Instruction, p.Input)
		return f.Tok.Encode(text, true), text, nil
	case p.Prompt != "" && !f.Chat:
		if p.System != "" {
			return nil, "", errors.New("a system message needs chat formatting (--chat): a plain prompt is continued as it is")
		}
		return f.Tok.Encode(p.Prompt, true), p.Prompt, nil
	}
	chat, err := f.Resolve()
	if err != nil {
		return nil, "", err
	}
	msgs := p.Messages
	if p.Prompt != "" {
		msgs = []tokenizer.Message{{Role: "user", Content: p.Prompt}}
	}
	if p.System != "" {
		msgs = append([]tokenizer.Message{{Role: "system", Content: p.System}}, msgs...)
	}
	return chat.EncodePrompt(msgs)
}

// StopTokens returns the ids that end a reply: the tokenizer's EOS, the model's eos ids, the chat template's
// end-of-turn token (the model template's, found by rendering an exchange: <|im_end|>, <end_of_turn>,
// <|end|>, ...), and <|eot_id|> and <|im_end|> when the vocabulary has them.
func (f Formatter) StopTokens(modelEOS ...int) []int {
	seen := map[int]bool{}
	var out []int
	add := func(id int) {
		if id >= 0 && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	if id, ok := f.Tok.EOS(); ok {
		add(id)
	}
	for _, id := range modelEOS {
		add(id)
	}
	if chat, err := f.Resolve(); err == nil {
		if id, ok := chat.EndOfTurn(); ok {
			add(id)
		}
	}
	for _, tok := range []string{"<|eot_id|>", "<|im_end|>"} {
		if id, ok := f.Tok.TokenID(tok); ok {
			add(id)
		}
	}
	return out
}
