package tokenizer

import (
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

// AlpacaPrompt is the Stanford Alpaca prompt for an instruction and an optional input; the response follows it.
func AlpacaPrompt(instruction, input string) string {
	if strings.TrimSpace(input) == "" {
		return "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n" +
			"### Instruction:\n" + instruction + "\n\n### Response:\n"
	}
	return "Below is an instruction that describes a task, paired with an input that provides further context. " +
		"Write a response that appropriately completes the request.\n\n### Instruction:\n" + instruction +
		"\n\n### Input:\n" + input + "\n\n### Response:\n"
}

// FormatInstruction encodes an Alpaca-style example for supervised fine-tuning, as the Stanford Alpaca training
// script does: ids are the prompt and the response encoded together (with the post-processor's special tokens)
// followed by EOS; labels repeat ids except that the prompt's tokens are IgnoreIndex, so only the response (and
// EOS) is learned.
func (t *Tokenizer) FormatInstruction(instruction, input, output string) (ids, labels []int) {
	prompt := AlpacaPrompt(instruction, input)
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
// (for generation rather than training).
func (t *Tokenizer) FormatChat(messages []Message, format string, addGenerationPrompt bool) (ids, labels []int, err error) {
	if format == "" {
		if format = t.ChatFormat(); format == "" {
			return nil, nil, fmt.Errorf("the tokenizer has no chat template memfit can render (known: %s, %s); use the Alpaca format instead", ChatLlama3, ChatML)
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
