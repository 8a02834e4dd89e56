// Package chattemplate renders a model's Hugging Face chat template (the Jinja `chat_template` of
// tokenizer_config.json, or chat_template.jinja) as transformers' apply_chat_template does, finds the text of
// each assistant turn in the rendering, and encodes conversations for training (labels on the assistant turns
// only) and for generation (ending with the assistant's header). Chat resolves a --chat-template choice: the
// model's template, or one of memfit's built-in templates (Llama-3, ChatML, Alpaca).
//
// The Jinja engine is github.com/ardanlabs/jinja, a pure-Go engine written for chat templates: it lexes with
// the trim_blocks and lstrip_blocks settings transformers uses, has loop controls, namespace, tojson (with
// Python's separators and ensure_ascii=False, as transformers' own tojson), Python's string and dict methods,
// raise_exception and strftime_now, and keeps dict keys in insertion order as Python does. This package adds
// what it leaves to the caller: the single trailing newline Jinja strips from a template's source, the
// variables apply_chat_template passes, and the {% generation %} markers' positions (the engine renders their
// body and forgets where it was).
package chattemplate

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/memfit/memfit/tokenizer"
)

// Template is a compiled chat template with the special-token variables of a tokenizer.
type Template struct {
	// Source is the Jinja text as the model ships it.
	Source string
	// From says where it was read ("tokenizer_config.json", "chat_template.jinja", a built-in template's name).
	From string
	// Generation reports whether the template marks the assistant's text with {% generation %} blocks.
	Generation bool

	plain  *jinja.Template // renders {% generation %} blocks as their body
	marked *jinja.Template // renders them between markers (nil without generation blocks)
	vars   map[string]jinja.Value
}

// RaisedError is a template's raise_exception: the template refuses the conversation and says why.
type RaisedError struct{ Message string }

func (e *RaisedError) Error() string { return e.Message }

// generationTag matches a {% generation %} or {% endgeneration %} tag with its whitespace controls.
var generationTag = regexp.MustCompile(`\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}`)

// Markers that the marked template writes where a generation block starts and ends; private-use characters,
// replaced by others when a conversation holds them (markerFor).
const (
	genStart = '\uF8F0'
	genEnd   = '\uF8F1'
)

// New compiles source (a Jinja chat template) for tok's special tokens: bos_token, eos_token, unk_token,
// pad_token, sep_token, cls_token, mask_token (those tokenizer_config.json sets) and
// additional_special_tokens, as apply_chat_template passes its tokenizer's special_tokens_map. from names the
// template in messages. Like Jinja, it drops one newline that ends the source (keep_trailing_newline is off)
// and reads \r\n and \r line ends as \n.
func New(source, from string, tok *tokenizer.Tokenizer) (*Template, error) {
	src := strings.ReplaceAll(strings.ReplaceAll(source, "\r\n", "\n"), "\r", "\n")
	src = guardSource(strings.TrimSuffix(src, "\n"))
	t := &Template{Source: source, From: from, vars: map[string]jinja.Value{}}
	var err error
	if t.plain, err = jinja.Compile(src); err != nil {
		return nil, fmt.Errorf("%s: the chat template does not parse: %w", from, err)
	}
	if generationTag.MatchString(src) {
		t.Generation = true
		// {%- generation -%} becomes {%- if true %}<marker>{% endif -%}: the same tag whitespace on the
		// outside (lstrip_blocks, trim_blocks and the - controls apply as they did), a marker inside.
		marked := generationTag.ReplaceAllStringFunc(src, func(tag string) string {
			m := generationTag.FindStringSubmatch(tag)
			marker := "{{ __gen_start }}"
			if m[2] != "" {
				marker = "{{ __gen_end }}"
			}
			return "{%" + m[1] + " if true %}" + marker + "{% endif " + m[3] + "%}"
		})
		if t.marked, err = jinja.Compile(marked); err != nil {
			return nil, fmt.Errorf("%s: the chat template's generation blocks: %w", from, err)
		}
	}
	if tok != nil {
		c := tok.Config
		for name, v := range map[string]string{"bos_token": c.BOSToken, "eos_token": c.EOSToken, "unk_token": c.UnkToken,
			"pad_token": c.PadToken, "sep_token": c.SepToken, "cls_token": c.ClsToken, "mask_token": c.MaskToken} {
			if v != "" {
				t.vars[name] = jinja.NewString(v)
			}
		}
		if len(c.AdditionalSpecialTokens) > 0 {
			items := make([]jinja.Value, len(c.AdditionalSpecialTokens))
			for i, s := range c.AdditionalSpecialTokens {
				items[i] = jinja.NewString(s)
			}
			t.vars["additional_special_tokens"] = jinja.NewList(items)
		}
	}
	return t, nil
}

// FromTokenizer compiles the tokenizer's own chat template (tokenizer.Config.ChatTemplate); an error says when
// it has none.
func FromTokenizer(tok *tokenizer.Tokenizer) (*Template, error) {
	if tok.Config.ChatTemplate == "" {
		if n := len(tok.Config.ChatTemplates); n > 0 {
			return nil, fmt.Errorf("the tokenizer's tokenizer_config.json has %d named chat templates (%s) and none named \"default\", the one memfit renders", n, strings.Join(templateNames(tok), ", "))
		}
		return nil, errors.New("the tokenizer has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja)")
	}
	return New(tok.Config.ChatTemplate, tok.Config.ChatTemplateFrom, tok)
}

func templateNames(tok *tokenizer.Tokenizer) []string {
	var names []string
	for n := range tok.Config.ChatTemplates {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Render renders a conversation as apply_chat_template(messages, tokenize=False, add_generation_prompt=...)
// does: the variables messages (each a dict of role and content), add_generation_prompt, tools and documents
// (None: memfit passes no tools), the special tokens, raise_exception (the template's refusal, returned as a
// *RaisedError) and strftime_now (the local time).
func (t *Template) Render(messages []tokenizer.Message, addGenerationPrompt bool) (string, error) {
	return t.render(t.plain, messages, addGenerationPrompt, nil)
}

func (t *Template) render(tmpl *jinja.Template, messages []tokenizer.Message, addGenerationPrompt bool, extra map[string]jinja.Value) (string, error) {
	data := make(map[string]jinja.Value, len(t.vars)+8)
	for k, v := range t.vars {
		data[k] = v
	}
	msgs := make([]jinja.Value, len(messages))
	for i, m := range messages {
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Content))
		msgs[i] = d
	}
	data["messages"] = jinja.NewList(msgs)
	data["add_generation_prompt"] = jinja.NewBool(addGenerationPrompt)
	data["tools"], data["documents"] = jinja.None(), jinja.None()
	var raised *RaisedError
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := "raise_exception"
		if len(args) > 0 && args[0].IsString() {
			msg = args[0].AsString()
		} else if len(args) > 0 {
			msg = args[0].String()
		}
		raised = &RaisedError{Message: msg}
		return jinja.Undefined(), raised
	})
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now takes one format string")
		}
		return jinja.NewString(strftime(now(), args[0].AsString())), nil
	})
	for k, v := range extra {
		data[k] = v
	}
	(&limits{}).install(data)
	out, err := tmpl.RenderValues(data)
	if raised != nil {
		return "", raised
	}
	if err != nil {
		return "", fmt.Errorf("%s: rendering the chat template: %w", t.From, err)
	}
	return out, nil
}
