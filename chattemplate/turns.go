package chattemplate

import (
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/memfit/memfit/tokenizer"
)

// Turn is the text of one assistant message in a rendered conversation.
type Turn struct {
	// Message is the message's index in the conversation.
	Message int
	// Start and End are the bytes of the rendering the model writes for the message: what a {% generation %}
	// block marks, or without such blocks the text that depends on the message (its content as the template
	// renders it: trimmed, its reasoning moved, ...).
	Start, End int
	// Limit is where the text of the next message begins (the end of the rendering after the last one): the
	// template's end of the turn (<|im_end|>, <|eot_id|>, </s>, ...) lies in [End, Limit). It is End for a
	// generation block, which holds the end of turn itself when the template means it to be learned.
	Limit int
}

// RenderTurns renders a conversation for training (no generation prompt) and locates its assistant turns. With
// {% generation %} blocks the turns are what they mark, as transformers' return_assistant_tokens_mask reads
// them. Without, each message's text is found by comparing renders: the conversation is rendered again with
// that message's content replaced by a probe, and the bytes where the two renders differ are the message's
// (the text before and after them is common to both). An assistant message whose content the template does not
// render, messages rendered out of order, or a template that refuses the conversation (raise_exception) are
// errors.
func (t *Template) RenderTurns(messages []tokenizer.Message) (string, []Turn, error) {
	if t.marked != nil {
		return t.markedTurns(messages)
	}
	text, err := t.Render(messages, false)
	if err != nil {
		return "", nil, err
	}
	probe := string(unusedRune(messages, '\uE000'))
	type region struct{ start, end int }
	regions := make([]*region, len(messages))
	for i, m := range messages {
		alt := append([]tokenizer.Message(nil), messages...)
		alt[i] = tokenizer.Message{Role: m.Role, Content: probe}
		other, err := t.Render(alt, false)
		if err != nil {
			return "", nil, fmt.Errorf("message %d: rendering it with other content: %w", i+1, err)
		}
		pre := commonPrefix(text, other)
		suf := commonSuffix(text[pre:], other[pre:])
		if !strings.Contains(other[pre:len(other)-suf], probe) {
			if m.Role == "assistant" {
				return "", nil, fmt.Errorf("message %d: the chat template does not render the assistant's content", i+1)
			}
			continue // a message the template leaves out (Mistral's system message, Phi-3's empty one)
		}
		regions[i] = &region{pre, len(text) - suf}
	}
	var turns []Turn
	last := 0
	for i, r := range regions {
		if r == nil {
			continue
		}
		if r.start < last {
			return "", nil, fmt.Errorf("message %d: the chat template renders the messages out of order; memfit cannot tell which text is the assistant's", i+1)
		}
		last = r.end
		if messages[i].Role != "assistant" {
			continue
		}
		limit := len(text)
		for _, next := range regions[i+1:] {
			if next != nil {
				limit = next.start
				break
			}
		}
		turns = append(turns, Turn{Message: i, Start: r.start, End: r.end, Limit: limit})
	}
	return text, turns, nil
}

// markedTurns renders with the generation blocks' markers and returns the text without them and the blocks as
// turns (Message is the index of the assistant message the block follows, -1 before any).
func (t *Template) markedTurns(messages []tokenizer.Message) (string, []Turn, error) {
	start := unusedRune(messages, genStart)
	end := unusedRune(messages, genEnd)
	if end == start {
		end = unusedRune(messages, start+1)
	}
	out, err := t.render(t.marked, messages, false, map[string]jinja.Value{
		"__gen_start": jinja.NewString(string(start)), "__gen_end": jinja.NewString(string(end))})
	if err != nil {
		return "", nil, err
	}
	var b strings.Builder
	var turns []Turn
	open := -1
	assistant := -1
	for _, r := range out {
		switch r {
		case start:
			if open >= 0 {
				return "", nil, fmt.Errorf("%s: a generation block opens inside another", t.From)
			}
			open = b.Len()
		case end:
			if open < 0 {
				return "", nil, fmt.Errorf("%s: endgeneration without generation", t.From)
			}
			assistant = nextAssistant(messages, assistant)
			turns = append(turns, Turn{Message: assistant, Start: open, End: b.Len(), Limit: b.Len()})
			open = -1
		default:
			b.WriteRune(r)
		}
	}
	if open >= 0 {
		return "", nil, fmt.Errorf("%s: a generation block is not closed", t.From)
	}
	return b.String(), turns, nil
}

// nextAssistant is the index of the first assistant message after after (-1 when none).
func nextAssistant(messages []tokenizer.Message, after int) int {
	for i := after + 1; i < len(messages); i++ {
		if messages[i].Role == "assistant" {
			return i
		}
	}
	return -1
}

// unusedRune returns r, or the first private-use character after it, that no message holds.
func unusedRune(messages []tokenizer.Message, r rune) rune {
	for ; ; r++ {
		used := false
		for _, m := range messages {
			if strings.ContainsRune(m.Content, r) || strings.ContainsRune(m.Role, r) {
				used = true
				break
			}
		}
		if !used {
			return r
		}
	}
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	// back to a character boundary
	for n > 0 && n < len(a) && !isStart(a[n]) {
		n--
	}
	return n
}

func commonSuffix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[len(a)-1-n] == b[len(b)-1-n] {
		n++
	}
	for n > 0 && n < len(a) && !isStart(a[len(a)-n]) {
		n--
	}
	return n
}

func isStart(c byte) bool { return c&0xC0 != 0x80 }

// Encoded is a conversation encoded for training.
type Encoded struct {
	// IDs are the rendering's tokens (Encode without the post-processor's special tokens, as
	// apply_chat_template tokenizes: the template writes BOS itself); Labels repeat them on the assistant turns
	// and are tokenizer.IgnoreIndex elsewhere.
	IDs, Labels []int
	// Turns are the token ranges [start, end) learned for each assistant turn.
	Turns [][2]int
	// Unended counts the turns after which the template writes no special token to learn (a model trained on
	// them does not learn to end its reply).
	Unended int
}

// Encode renders a conversation for training and encodes it with labels on the assistant turns only: the
// tokens that hold a turn's text (RenderTurns; a token straddling its edge counts), and after it, when the
// template has no generation blocks, the tokens up to and including the first special token before the next
// message (the turn's end: <|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>, </s>), which the model must write
// to end its reply. Text between turns (role headers, the newline after <|im_end|>) is context.
func (t *Template) Encode(tok *tokenizer.Tokenizer, messages []tokenizer.Message) (Encoded, error) {
	text, turns, err := t.RenderTurns(messages)
	if err != nil {
		return Encoded{}, err
	}
	var positions []int
	for _, tr := range turns {
		positions = append(positions, tr.Start, tr.End, tr.Limit)
	}
	ids, at, err := tok.EncodeAt(text, positions)
	if err != nil {
		return Encoded{}, err
	}
	e := Encoded{IDs: ids, Labels: make([]int, len(ids))}
	for i := range e.Labels {
		e.Labels[i] = tokenizer.IgnoreIndex
	}
	eos, hasEOS := tok.EOS()
	for k, tr := range turns {
		start, end := at[3*k].Before, at[3*k+1].Started
		if tr.Start == tr.End {
			start, end = at[3*k+1].Started, at[3*k+1].Started
		}
		if t.marked == nil {
			// the end of the turn: up to the first special token between the text and the next message
			ended := false
			for j := at[3*k+1].Started; j < at[3*k+2].Before; j++ {
				if tok.IsSpecial(ids[j]) || (hasEOS && ids[j] == eos) {
					end, ended = j+1, true
					break
				}
			}
			if !ended {
				e.Unended++
			}
		}
		for j := start; j < end; j++ {
			e.Labels[j] = ids[j]
		}
		if end > start {
			e.Turns = append(e.Turns, [2]int{start, end})
		}
	}
	return e, nil
}

// Prompt renders a conversation for generation (add_generation_prompt: the assistant's header follows the
// last message) and encodes it.
func (t *Template) Prompt(tok *tokenizer.Tokenizer, messages []tokenizer.Message) ([]int, string, error) {
	text, err := t.Render(messages, true)
	if err != nil {
		return nil, "", err
	}
	return tok.Encode(text, false), text, nil
}

// EndOfTurn returns the token that ends an assistant turn in this template: the first special token after the
// reply in a rendered [user, assistant] exchange (false when there is none, or the template refuses it).
func (t *Template) EndOfTurn(tok *tokenizer.Tokenizer) (int, bool) {
	e, err := t.Encode(tok, []tokenizer.Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello"}})
	if err != nil || len(e.Turns) == 0 {
		return 0, false
	}
	last := e.IDs[e.Turns[len(e.Turns)-1][1]-1]
	if !tok.IsSpecial(last) {
		return 0, false
	}
	return last, true
}
