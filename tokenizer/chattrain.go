package tokenizer

import (
	"errors"
	"fmt"
)

// ChatAlpaca is the Stanford Alpaca prompt as a chat template (generate's "alpaca" template): the conversation
// before the last user message is the input, that message the instruction (AlpacaConversation).
const ChatAlpaca = "alpaca"

// FormatConversation encodes a conversation for supervised fine-tuning with a chat template, the same rendering
// generation uses, and labels it so that only the assistant's replies are learned:
//
//   - ChatLlama3 and ChatML (FormatChat): every message in order with the template's role headers; labels are
//     IgnoreIndex everywhere except each assistant turn's content and its end-of-turn token (<|eot_id|>,
//     <|im_end|>), so every assistant turn of a multi-turn conversation is learned and a system prompt is kept
//     as context.
//   - ChatAlpaca: the Alpaca prompt has one reply, so the conversation must end with the assistant's turn: the
//     prompt is AlpacaConversation of the messages before it (a system message in place of the preamble, the
//     earlier turns as the input, the last user message as the instruction) and the reply is learned with EOS,
//     encoded exactly as FormatInstruction encodes an Alpaca row. [user, assistant] therefore gives
//     FormatInstruction(user, "", assistant) token for token; earlier assistant turns are context, not learned.
func (t *Tokenizer) FormatConversation(messages []Message, format string) (ids, labels []int, err error) {
	if format != ChatAlpaca {
		return t.FormatChat(messages, format, false)
	}
	n := len(messages)
	if n == 0 || messages[n-1].Role != "assistant" {
		return nil, nil, errors.New("the Alpaca template learns the reply that ends a conversation: its last message must be the assistant's (or train with a chat template: --chat-template llama3 or chatml, and the model's tokenizer)")
	}
	if n < 2 || messages[n-2].Role != "user" {
		what := "it has no message before it"
		if n >= 2 {
			what = fmt.Sprintf("message %d before it is the %s's", n-1, messages[n-2].Role)
		}
		return nil, nil, fmt.Errorf("the Alpaca template learns the final assistant reply as the answer to the user message just before it, but %s (give a user message before the reply, or train with a chat template: --chat-template llama3 or chatml)", what)
	}
	prompt, err := AlpacaConversation(messages[:n-1])
	if err != nil {
		return nil, nil, fmt.Errorf("%w (or train with a chat template: --chat-template llama3 or chatml)", err)
	}
	ids, labels = t.formatReply(prompt, messages[n-1].Content)
	return ids, labels, nil
}
