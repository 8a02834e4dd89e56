package chattemplate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/memfit/memfit/tokenizer"
)

// Choices of --chat-template.
const (
	// Auto is the model's own template when its tokenizer has one, else Alpaca.
	Auto = "auto"
	// Model is the model's own Jinja template (tokenizer_config.json's chat_template or chat_template.jinja).
	Model = "model"
	// Llama3, ChatML and Alpaca are memfit's built-in templates, for a model without one of its own (or to
	// override it): Llama-3's headers and <|eot_id|>, ChatML's <|im_start|>/<|im_end|>, and the Stanford Alpaca
	// prompt memfit's instruction tuning trains on.
	Llama3 = tokenizer.ChatLlama3
	ChatML = tokenizer.ChatML
	Alpaca = tokenizer.ChatAlpaca
)

// Choices lists the values of --chat-template.
var Choices = []string{Auto, Model, Llama3, ChatML, Alpaca}

// Chat is the chat template that a model's conversations take, for training and for generation.
type Chat struct {
	// Name is Model, Llama3, ChatML or Alpaca.
	Name string
	// Template is the model's compiled template when Name is Model.
	Template *Template
	// Note says what auto chose when the model has no template of its own ("" otherwise).
	Note string
	tok  *tokenizer.Tokenizer
}

// Resolve returns the chat template of choice (one of Choices; "" is Auto) for the tokenizer: auto takes the
// model's template when the tokenizer has one (tokenizer.Config.ChatTemplate) and Alpaca otherwise, saying so
// in Note. The built-in Llama-3 and ChatML templates need their special tokens in the vocabulary
// (tokenizer.CheckChatFormat); the model's template must parse.
func Resolve(tok *tokenizer.Tokenizer, choice string) (*Chat, error) {
	c := &Chat{Name: choice, tok: tok}
	switch choice {
	case "", Auto:
		if tok.Config.ChatTemplate == "" {
			c.Name = Alpaca
			why := "the tokenizer has no chat template"
			if n := len(tok.Config.ChatTemplates); n > 0 {
				why = fmt.Sprintf("the tokenizer's %d named chat templates (%s) have none named \"default\"", n, strings.Join(templateNames(tok), ", "))
			}
			c.Note = why + ": conversations take memfit's Alpaca prompt (give --chat-template llama3, chatml or alpaca to choose)"
			return c, nil
		}
		c.Name = Model
		fallthrough
	case Model:
		t, err := FromTokenizer(tok)
		if err != nil {
			return nil, err
		}
		c.Template = t
	case Llama3, ChatML:
		if err := tok.CheckChatFormat(choice); err != nil {
			return nil, err
		}
	case Alpaca:
	default:
		return nil, fmt.Errorf("unknown chat template %q: use one of %s", choice, strings.Join(Choices, ", "))
	}
	return c, nil
}

// String names the template for messages and run.yaml: "model (tokenizer_config.json)", "llama3", ...
func (c *Chat) String() string {
	if c.Template != nil && c.tok != nil && c.tok.Config.ChatTemplateUnused != "" && c.Template.From == c.tok.Config.ChatTemplateFrom {
		return fmt.Sprintf("%s (%s; %s's different chat_template is not used, as in transformers)", c.Name, c.Template.From, c.tok.Config.ChatTemplateUnused)
	}
	if c.Template != nil {
		return fmt.Sprintf("%s (%s)", c.Name, c.Template.From)
	}
	return c.Name
}

// EncodeTraining encodes a conversation for training, labels on the assistant's turns only: the model's
// template through Template.Encode, the built-in ones through tokenizer.FormatConversation. unended counts the
// turns after which the template writes no special token to learn.
func (c *Chat) EncodeTraining(messages []tokenizer.Message) (ids, labels []int, unended int, err error) {
	if c.Template == nil {
		ids, labels, err = c.tok.FormatConversation(messages, c.Name)
		return ids, labels, 0, err
	}
	e, err := c.Template.Encode(c.tok, messages)
	if err != nil {
		return nil, nil, 0, c.refused(err)
	}
	if len(e.Turns) == 0 {
		return nil, nil, 0, fmt.Errorf("no assistant turn to learn (the conversation needs an assistant message)")
	}
	return e.IDs, e.Labels, e.Unended, nil
}

// EncodePrompt encodes a conversation to be continued by the assistant, and returns the text it renders: the
// model's template with add_generation_prompt, Llama-3 and ChatML as tokenizer.FormatChat renders them, Alpaca
// as tokenizer.AlpacaConversation (the last message must be the user's).
func (c *Chat) EncodePrompt(messages []tokenizer.Message) ([]int, string, error) {
	switch {
	case c.Template != nil:
		ids, text, err := c.Template.Prompt(c.tok, messages)
		return ids, text, c.refused(err)
	case c.Name == Alpaca:
		text, err := tokenizer.AlpacaConversation(messages)
		if err != nil {
			return nil, "", err
		}
		return c.tok.Encode(text, true), text, nil
	}
	ids, _, err := c.tok.FormatChat(messages, c.Name, true)
	if err != nil {
		return nil, "", err
	}
	return ids, c.tok.Decode(ids, false), nil
}

// refused says which template refused a conversation (raise_exception), and how to train it otherwise.
func (c *Chat) refused(err error) error {
	var raised *RaisedError
	if errors.As(err, &raised) {
		return fmt.Errorf("the model's chat template (%s) refuses the conversation: %w (change the conversation, or give --chat-template llama3, chatml or alpaca)", c.Template.From, err)
	}
	return err
}

// EndOfTurn returns the token that ends the assistant's turn in this template, when it has one of its own
// (<|eot_id|>, <|im_end|>, <end_of_turn>, <|end|>; false for Alpaca, whose reply ends with EOS).
func (c *Chat) EndOfTurn() (int, bool) {
	switch {
	case c.Template != nil:
		return c.Template.EndOfTurn(c.tok)
	case c.Name == Llama3:
		return c.tok.TokenID("<|eot_id|>")
	case c.Name == ChatML:
		return c.tok.TokenID("<|im_end|>")
	}
	return 0, false
}
