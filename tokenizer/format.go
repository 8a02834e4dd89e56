package tokenizer

import (
	"errors"
	"fmt"
	"strings"
)

// IgnoreIndex is the label of tokens that take no part in the loss (prompt tokens, padding), as in PyTorch and
// Hugging Face training scripts.
const IgnoreIndex = -100

// Padding sides and truncation directions for EncodeBatch.
const (
	Right = "right"
	Left  = "left"
)

// BatchOptions configure EncodeBatch.
type BatchOptions struct {
	// AddSpecial applies the post-processor to every text.
	AddSpecial bool
	// MaxLength truncates longer encodings (0: no limit); Truncation says which end is cut ("right", the
	// default, keeps the beginning; "left" keeps the end).
	MaxLength  int
	Truncation string
	// PadToMax pads every row to MaxLength instead of to the longest row; PadSide is "right" (default) or "left".
	PadToMax bool
	PadSide  string
}

// Batch is a padded batch of encodings.
type Batch struct {
	// IDs are the token ids, [rows][length]; AttentionMask is 1 for real tokens and 0 for padding.
	IDs           [][]int
	AttentionMask [][]int
}

// EncodeBatch encodes texts and pads them to one length with the padding token (or id 0 when the tokenizer has
// none, which the attention mask hides anyway).
func (t *Tokenizer) EncodeBatch(texts []string, o BatchOptions) (Batch, error) {
	if o.Truncation == "" {
		o.Truncation = Right
	}
	if o.PadSide == "" {
		o.PadSide = Right
	}
	if (o.Truncation != Right && o.Truncation != Left) || (o.PadSide != Right && o.PadSide != Left) {
		return Batch{}, fmt.Errorf("truncation and padding side must be %q or %q", Left, Right)
	}
	if o.PadToMax && o.MaxLength <= 0 {
		return Batch{}, fmt.Errorf("padding to the maximum length needs MaxLength")
	}
	rows := make([][]int, len(texts))
	longest := 0
	for i, text := range texts {
		ids := t.Encode(text, o.AddSpecial)
		rows[i] = Truncate(ids, o.MaxLength, o.Truncation)
		longest = max(longest, len(rows[i]))
	}
	if o.PadToMax {
		longest = o.MaxLength
	}
	pad, ok := t.Pad()
	if !ok {
		pad = 0
	}
	b := Batch{IDs: make([][]int, len(rows)), AttentionMask: make([][]int, len(rows))}
	for i, ids := range rows {
		b.IDs[i], b.AttentionMask[i] = PadRow(ids, longest, pad, o.PadSide)
	}
	return b, nil
}

// Truncate returns ids cut to maxLength (0: unchanged) from the given side ("right" keeps the beginning).
func Truncate(ids []int, maxLength int, side string) []int {
	if maxLength <= 0 || len(ids) <= maxLength {
		return ids
	}
	if side == Left {
		return ids[len(ids)-maxLength:]
	}
	return ids[:maxLength]
}

// PadRow returns ids padded with pad to length on the given side, and its attention mask.
func PadRow(ids []int, length, pad int, side string) (padded, mask []int) {
	padded = make([]int, length)
	mask = make([]int, length)
	off := 0
	if side == Left {
		off = length - len(ids)
	}
	for i := range padded {
		padded[i] = pad
	}
	for i, id := range ids {
		padded[off+i], mask[off+i] = id, 1
	}
	return padded, mask
}

// The Stanford Alpaca prompt's preambles, without and with an input.
const (
	alpacaPreamble      = "Below is an instruction that describes a task. Write a response that appropriately completes the request."
	alpacaInputPreamble = "Below is an instruction that describes a task, paired with an input that provides further context. " +
		"Write a response that appropriately completes the request."
)

// AlpacaPrompt is the Stanford Alpaca prompt for an instruction and an optional input; the response follows it.
func AlpacaPrompt(instruction, input string) string {
	return AlpacaSystemPrompt("", instruction, input)
}

// AlpacaSystemPrompt is AlpacaPrompt with a system message in place of the preamble ("Below is an instruction
// that describes a task..."), as FastChat's and axolotl's Alpaca chat templates put a system message; system ""
// keeps the preamble, which is then AlpacaPrompt exactly.
func AlpacaSystemPrompt(system, instruction, input string) string {
	hasInput := strings.TrimSpace(input) != ""
	if system == "" {
		system = alpacaPreamble
		if hasInput {
			system = alpacaInputPreamble
		}
	}
	if !hasInput {
		return system + "\n\n### Instruction:\n" + instruction + "\n\n### Response:\n"
	}
	return system + "\n\n### Instruction:\n" + instruction + "\n\n### Input:\n" + input + "\n\n### Response:\n"
}

// AlpacaConversation renders a conversation in the Alpaca prompt memfit's instruction tuning trains on, for the
// reply to its last message, which must be the user's:
//
//   - the last message is the instruction;
//   - a system message, allowed only as the first message, takes the place of the preamble
//     (AlpacaSystemPrompt);
//   - the turns between them are the input, the context the instruction is paired with: one line per turn,
//     "User: " or "Assistant: " and the content, in order.
//
// A single user message renders as AlpacaPrompt(content, "") exactly, as training formats an instruction. A
// conversation that does not end with a user message, or holds a system message elsewhere than first, is an
// error (the Alpaca prompt has no place for it).
func AlpacaConversation(messages []Message) (string, error) {
	system := ""
	if len(messages) > 0 && messages[0].Role == "system" {
		system, messages = messages[0].Content, messages[1:]
		if strings.TrimSpace(system) == "" {
			system = ""
		}
	}
	if len(messages) == 0 || messages[len(messages)-1].Role != "user" {
		return "", errors.New("the Alpaca template renders a conversation that ends with a user message (the instruction the reply answers)")
	}
	var context []string
	for _, m := range messages[:len(messages)-1] {
		switch m.Role {
		case "user":
			context = append(context, "User: "+m.Content)
		case "assistant":
			context = append(context, "Assistant: "+m.Content)
		case "system":
			return "", errors.New("the Alpaca template takes a system message only as the first message")
		default:
			return "", fmt.Errorf("message role %q: use system, user or assistant", m.Role)
		}
	}
	return AlpacaSystemPrompt(system, messages[len(messages)-1].Content, strings.Join(context, "\n")), nil
}

// FormatInstruction encodes an Alpaca-style example for supervised fine-tuning, as the Stanford Alpaca training
// script does: ids are the prompt and the response encoded together (with the post-processor's special tokens)
// followed by EOS; labels repeat ids except that the prompt's tokens are IgnoreIndex, so only the response (and
// EOS) is learned.
func (t *Tokenizer) FormatInstruction(instruction, input, output string) (ids, labels []int) {
	return t.formatReply(AlpacaPrompt(instruction, input), output)
}

// formatReply encodes prompt and reply together (with the post-processor's special tokens) followed by EOS,
// labels IgnoreIndex on the prompt's tokens: FormatInstruction's encoding, for any Alpaca prompt.
func (t *Tokenizer) formatReply(prompt, output string) (ids, labels []int) {
	promptLen := len(t.Encode(prompt, true))
	ids = t.Encode(prompt+output, true)
	if eos, ok := t.EOS(); ok && (len(ids) == 0 || ids[len(ids)-1] != eos) {
		ids = append(ids, eos)
	}
	labels = make([]int, len(ids))
	for i, id := range ids {
		labels[i] = id
		if i < promptLen {
			labels[i] = IgnoreIndex
		}
	}
	return ids, labels
}

// Message is one turn of a conversation.
type Message struct {
	Role    string `json:"role"` // system, user or assistant
	Content string `json:"content"`
}

// Chat formats that FormatChat knows, recognised from tokenizer_config.json's chat_template by their markers.
const (
	ChatLlama3 = "llama3" // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
	ChatML     = "chatml" // <|im_start|>role\ncontent<|im_end|>\n
)

// ChatTokens are the special tokens each chat format's markup is made of. A model trained on the format saw each
// as one token; a tokenizer without them would encode the markup as plain text, so the model would not see its
// template and would never produce the end-of-turn token that ends its reply.
var ChatTokens = map[string][]string{
	ChatLlama3: {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
	ChatML:     {"<|im_start|>", "<|im_end|>"},
}

// MissingChatTokens returns the tokens of format's markup (ChatTokens) that the tokenizer does not encode as one
// token of their own (nil when it has them all, or format is not in ChatTokens).
func (t *Tokenizer) MissingChatTokens(format string) []string {
	var missing []string
	for _, tok := range ChatTokens[format] {
		id, ok := t.TokenID(tok)
		if ids := t.Encode(tok, false); !ok || len(ids) != 1 || ids[0] != id {
			missing = append(missing, tok)
		}
	}
	return missing
}

// CheckChatFormat returns an error naming the special tokens of format's markup that the tokenizer lacks (nil
// when it has them all).
func (t *Tokenizer) CheckChatFormat(format string) error {
	if missing := t.MissingChatTokens(format); len(missing) > 0 {
		return fmt.Errorf("the %s chat template needs special tokens this tokenizer lacks: %s (it would encode them as plain text, and the model's end of turn would never come): use the model's own tokenizer, or the alpaca template",
			format, strings.Join(missing, ", "))
	}
	return nil
}

// ChatFormat returns the chat format of the tokenizer's chat template ("" when there is none or it is not one
// of the simple formats memfit renders).
func (t *Tokenizer) ChatFormat() string {
	tmpl := t.Config.ChatTemplate
	switch {
	case strings.Contains(tmpl, "<|start_header_id|>") && strings.Contains(tmpl, "<|eot_id|>"):
		return ChatLlama3
	case strings.Contains(tmpl, "<|im_start|>") && strings.Contains(tmpl, "<|im_end|>"):
		return ChatML
	}
	return ""
}

// FormatChat renders a conversation with the tokenizer's chat format (format "" picks it from the chat
// template) and encodes it; labels are IgnoreIndex everywhere except the assistant turns' content and their end
// marker, so a model learns only its own replies. addGenerationPrompt appends the header of an assistant turn
// (for generation rather than training). Every message is rendered, in order, as the Hugging Face templates do:
// Llama-3 puts BOS first and trims each content; ChatML keeps contents as they are. A tokenizer without the
// format's special tokens (ChatTokens) is an error naming the missing ones.
func (t *Tokenizer) FormatChat(messages []Message, format string, addGenerationPrompt bool) (ids, labels []int, err error) {
	if format == "" {
		if format = t.ChatFormat(); format == "" {
			return nil, nil, fmt.Errorf("the tokenizer has no chat template memfit can render (known: %s, %s); use the Alpaca format instead", ChatLlama3, ChatML)
		}
	}
	if _, known := ChatTokens[format]; known {
		if err := t.CheckChatFormat(format); err != nil {
			return nil, nil, err
		}
	}
	add := func(text string, learn bool) {
		seg := t.Encode(text, false)
		ids = append(ids, seg...)
		for _, id := range seg {
			if learn {
				labels = append(labels, id)
			} else {
				labels = append(labels, IgnoreIndex)
			}
		}
	}
	switch format {
	case ChatLlama3:
		if bos, ok := t.BOS(); ok {
			ids, labels = append(ids, bos), append(labels, IgnoreIndex)
		}
		for _, m := range messages {
			add("<|start_header_id|>"+m.Role+"<|end_header_id|>\n\n", false)
			add(strings.TrimSpace(m.Content)+"<|eot_id|>", m.Role == "assistant")
		}
		if addGenerationPrompt {
			add("<|start_header_id|>assistant<|end_header_id|>\n\n", false)
		}
	case ChatML:
		for _, m := range messages {
			add("<|im_start|>"+m.Role+"\n", false)
			add(m.Content+"<|im_end|>", m.Role == "assistant")
			add("\n", false)
		}
		if addGenerationPrompt {
			add("<|im_start|>assistant\n", false)
		}
	default:
		return nil, nil, fmt.Errorf("unknown chat format %q (known: %s, %s)", format, ChatLlama3, ChatML)
	}
	return ids, labels, nil
}
