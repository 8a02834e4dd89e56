// Package generate turns what a user asks into token ids for runner.Generator and its tokens back into text:
// prompt files (plain prompts, Alpaca instructions, chat conversations), the model's chat template (Llama-3,
// ChatML or Alpaca), the tokens that end a reply, and a streamer that prints text as tokens arrive. The
// decoding itself (key/value cache, sampling) is runner.Generator's.
package generate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/tokenizer"
)

// Chat templates: tokenizer.ChatLlama3 and tokenizer.ChatML (the tokenizer's own, from tokenizer_config.json),
// and the Stanford Alpaca prompt that memfit's instruction fine-tuning trains on (AlpacaPrompt).
const (
	TemplateAuto   = "auto" // the tokenizer's chat template when it is one memfit renders, else Alpaca
	TemplateLlama3 = tokenizer.ChatLlama3
	TemplateChatML = tokenizer.ChatML
	TemplateAlpaca = "alpaca"
)

// Templates lists the values of a template choice.
var Templates = []string{TemplateAuto, TemplateLlama3, TemplateChatML, TemplateAlpaca}

// Prompt is one request: a plain text (continued as it is), an Alpaca instruction with optional input, or a
// conversation. Prompt files hold one JSON object per line with these keys.
type Prompt struct {
	// Prompt is a plain text; with chat formatting it is the user's turn.
	Prompt string `json:"prompt,omitempty"`
	// Instruction and Input are an Alpaca row's (formatted with the Alpaca prompt, as training formats them).
	Instruction string `json:"instruction,omitempty"`
	Input       string `json:"input,omitempty"`
	// Messages is a conversation (rendered with the chat template, ending with the assistant's header).
	Messages []tokenizer.Message `json:"messages,omitempty"`
	// System is a system message put before the user's turn in chat formatting (ignored by Alpaca).
	System string `json:"system,omitempty"`
}

// ReadPrompts reads a JSONL prompt file: one Prompt object per non-blank line.
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
	err := data.EachLine(r, func(line int, text string) error {
		if text = strings.TrimSpace(text); text == "" {
			return nil
		}
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		var p Prompt
		if err := dec.Decode(&p); err != nil {
			return fmt.Errorf("%s:%d: %v (each line is a JSON object with prompt, instruction/input or messages, and optionally system)", name, line, err)
		}
		if err := p.check(); err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
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
	return nil
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

// Resolved returns the template that applies: Template, or for auto the tokenizer's chat format, else Alpaca.
func (f Formatter) Resolved() (string, error) {
	switch f.Template {
	case "", TemplateAuto:
		if c := f.Tok.ChatFormat(); c != "" {
			return c, nil
		}
		return TemplateAlpaca, nil
	case TemplateLlama3, TemplateChatML, TemplateAlpaca:
		return f.Template, nil
	}
	return "", fmt.Errorf("unknown chat template %q: use one of %s", f.Template, strings.Join(Templates, ", "))
}

// Encode returns the token ids of p, ready to be continued, and the text they render (for display).
func (f Formatter) Encode(p Prompt) ([]int, string, error) {
	if err := p.check(); err != nil {
		return nil, "", err
	}
	tmpl, err := f.Resolved()
	if err != nil {
		return nil, "", err
	}
	alpaca := func(instruction, input string) ([]int, string) {
		text := tokenizer.AlpacaPrompt(instruction, input)
		return f.Tok.Encode(text, true), text
	}
	switch {
	case p.Instruction != "":
		ids, text := alpaca(p.Instruction, p.Input)
		return ids, text, nil
	case p.Prompt != "" && !f.Chat:
		return f.Tok.Encode(p.Prompt, true), p.Prompt, nil
	}
	msgs := p.Messages
	if p.Prompt != "" {
		msgs = []tokenizer.Message{{Role: "user", Content: p.Prompt}}
	}
	if p.System != "" {
		msgs = append([]tokenizer.Message{{Role: "system", Content: p.System}}, msgs...)
	}
	if tmpl == TemplateAlpaca {
		// The Alpaca prompt has one instruction: the last user turn (a system message is not part of it).
		last := ""
		for _, m := range msgs {
			if m.Role == "user" {
				last = m.Content
			}
		}
		if last == "" {
			return nil, "", errors.New("the Alpaca template needs a user message")
		}
		ids, text := alpaca(last, "")
		return ids, text, nil
	}
	ids, _, err := f.Tok.FormatChat(msgs, tmpl, true)
	if err != nil {
		return nil, "", err
	}
	return ids, f.Tok.Decode(ids, false), nil
}

// StopTokens returns the ids that end a reply: the tokenizer's EOS, the model's eos ids, and the template's
// end-of-turn token (<|eot_id|> for Llama-3, <|im_end|> for ChatML) when the vocabulary has it.
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
	for _, tok := range []string{"<|eot_id|>", "<|im_end|>"} {
		if id, ok := f.Tok.TokenID(tok); ok {
			add(id)
		}
	}
	return out
}
