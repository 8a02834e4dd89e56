package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Text is a prompt or a completion of a preference pair, in one of TRL's two forms: a string (the standard
// form) or a list of messages (the conversational form, rendered with the chat template).
type Text struct {
	// String is the text of the standard form.
	String string
	// Messages are the turns of the conversational form (nil in the standard form).
	Messages []Message
}

// Conversational reports whether t is in the conversational form.
func (t Text) Conversational() bool { return t.Messages != nil }

// Preference is one preference pair: a prompt, the completion preferred for it (Chosen) and the one dispreferred
// (Rejected), all in the same form. Line is where it was read (a JSONL line, 1-based; a parquet row, 0-based;
// 0 when it came from elsewhere).
type Preference struct {
	Prompt, Chosen, Rejected Text
	Line                     int
}

// ReadPreferences reads a JSONL file of preference pairs, one per non-blank line, in TRL's preference format:
// {"prompt": ..., "chosen": ..., "rejected": ...}, each a string (standard) or a list of {"role", "content"}
// messages (conversational: the prompt's turns, then each completion's, normally one assistant message). A row
// without "prompt" has it implicit: the longest common start of chosen and rejected is taken as the prompt
// (ExtractPrompt, as TRL's extract_prompt). Other keys are ignored. Every pair is checked (CheckPreference); a
// bad one, a row of another kind, or a line longer than MaxLineBytes is an error naming the file and line.
func ReadPreferences(path string) ([]Preference, error) {
	var out []Preference
	err := EachFileLine(path, func(line int, text string) error {
		if strings.TrimSpace(text) == "" {
			return nil
		}
		keys, err := decodeRow(text)
		if err != nil {
			return fmt.Errorf("%s:%d: %v", path, line, err)
		}
		if kind := rowKind(keys); kind != KindPreference {
			if kind == "" {
				return fmt.Errorf("%s:%d: not %s", path, line, kindNames[KindPreference])
			}
			return mixedKind(path, line, kind, KindPreference)
		}
		p := Preference{Line: line}
		for _, f := range []struct {
			key string
			to  *Text
		}{{"prompt", &p.Prompt}, {"chosen", &p.Chosen}, {"rejected", &p.Rejected}} {
			raw, ok := keys[f.key]
			if !ok {
				if f.key == "prompt" {
					continue
				}
				return fmt.Errorf("%s:%d: the pair has no %q", path, line, f.key)
			}
			if *f.to, err = parseText(raw); err != nil {
				return fmt.Errorf("%s:%d: %q %v", path, line, f.key, err)
			}
		}
		if _, ok := keys["prompt"]; !ok {
			if p, err = ExtractPrompt(p); err != nil {
				return fmt.Errorf("%s:%d: %v", path, line, err)
			}
		}
		if err := CheckPreference(p); err != nil {
			return fmt.Errorf("%s:%d: %v", path, line, err)
		}
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no preference pairs", path)
	}
	return out, nil
}

// parseText reads a JSON value as a Text: a string, or a list of {"role", "content"} messages.
func parseText(raw json.RawMessage) (Text, error) {
	trimmed := strings.TrimSpace(string(raw))
	if strings.HasPrefix(trimmed, "[") {
		var items []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return Text{}, errors.New(`must be a string or a list of {"role", "content"} messages`)
		}
		msgs := make([]Message, len(items))
		for i, it := range items {
			role, err := jsonString(it["role"])
			if err != nil {
				return Text{}, fmt.Errorf("message %d: \"role\" must be a string (%v)", i+1, err)
			}
			content, err := jsonString(it["content"])
			if err != nil {
				return Text{}, fmt.Errorf("message %d (%s): \"content\" must be a string (%v)", i+1, role, err)
			}
			msgs[i] = Message{Role: role, Content: content}
		}
		return Text{Messages: msgs}, nil
	}
	s, err := jsonString(raw)
	if err != nil {
		return Text{}, fmt.Errorf(`must be a string or a list of {"role", "content"} messages, %v`, err)
	}
	return Text{String: s}, nil
}

// ExtractPrompt returns p with its prompt taken out of chosen and rejected, where it is implicit (TRL's
// extract_prompt): in the conversational form, the longest run of turns that both begin with; in the standard
// form, their longest common start, ended before the last space it would keep (so the completions begin with
// their space, as a separately given prompt leaves them). A pair whose completions share nothing, or of which one
// is all prompt, is an error.
func ExtractPrompt(p Preference) (Preference, error) {
	c, r := p.Chosen, p.Rejected
	if c.Conversational() != r.Conversational() {
		return p, errors.New(`"chosen" and "rejected" must both be strings or both message lists`)
	}
	if c.Conversational() {
		n := 0
		for n < len(c.Messages) && n < len(r.Messages) && c.Messages[n] == r.Messages[n] {
			n++
		}
		if n == 0 || n == len(c.Messages) || n == len(r.Messages) {
			return p, errors.New(`no "prompt": the prompt is taken as the turns chosen and rejected both begin with, and they share none (or one is all prompt): give "prompt"`)
		}
		p.Prompt = Text{Messages: c.Messages[:n]}
		p.Chosen, p.Rejected = Text{Messages: c.Messages[n:]}, Text{Messages: r.Messages[n:]}
		return p, nil
	}
	a, b := c.String, r.String
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	for n > 0 && n < len(a) && !utf8.RuneStart(a[n]) { // a character, not a byte, differs (TRL compares characters)
		n--
	}
	if n > 0 && n < len(a) && n < len(b) && a[n-1] == ' ' {
		n--
	}
	if n == 0 || n == len(a) || n == len(b) {
		return p, errors.New(`no "prompt": the prompt is taken as the text chosen and rejected both begin with, and they share none (or one is all prompt): give "prompt"`)
	}
	p.Prompt = Text{String: a[:n]}
	p.Chosen, p.Rejected = Text{String: a[n:]}, Text{String: b[n:]}
	return p, nil
}

// CheckPreference checks a pair: prompt, chosen and rejected all strings or all message lists; non-empty
// completions; in the conversational form, known roles (system only first), a prompt that ends with a user turn
// (the completions answer it) and completions of assistant turns only.
func CheckPreference(p Preference) error {
	conv := p.Chosen.Conversational()
	if p.Rejected.Conversational() != conv || p.Prompt.Conversational() != conv {
		return errors.New(`"prompt", "chosen" and "rejected" must all be strings (the standard form) or all message lists (the conversational form)`)
	}
	if !conv {
		if strings.TrimSpace(p.Chosen.String) == "" || strings.TrimSpace(p.Rejected.String) == "" {
			return errors.New(`"chosen" and "rejected" must not be empty (or only spaces)`)
		}
		return nil
	}
	if len(p.Prompt.Messages) == 0 {
		return errors.New(`"prompt" has no messages`)
	}
	for i, m := range p.Prompt.Messages {
		switch {
		case m.Role == "system" && i > 0:
			return fmt.Errorf(`"prompt" message %d: a system message goes first`, i+1)
		case m.Role != "system" && m.Role != "user" && m.Role != "assistant":
			return fmt.Errorf(`"prompt" message %d: role %q: use system, user or assistant`, i+1, m.Role)
		case strings.TrimSpace(m.Content) == "":
			return fmt.Errorf(`"prompt" message %d (%s) has empty content`, i+1, m.Role)
		}
	}
	if last := p.Prompt.Messages[len(p.Prompt.Messages)-1]; last.Role != "user" {
		return fmt.Errorf(`"prompt" ends with %s message: the completions answer the prompt's last user turn, so it must end with one`, article(last.Role))
	}
	for _, f := range []struct {
		key  string
		msgs []Message
	}{{"chosen", p.Chosen.Messages}, {"rejected", p.Rejected.Messages}} {
		if len(f.msgs) == 0 {
			return fmt.Errorf("%q has no messages", f.key)
		}
		for i, m := range f.msgs {
			if m.Role != "assistant" {
				return fmt.Errorf("%q message %d has role %q: a completion is the assistant's reply", f.key, i+1, m.Role)
			}
			if strings.TrimSpace(m.Content) == "" {
				return fmt.Errorf("%q message %d has empty content", f.key, i+1)
			}
		}
	}
	return nil
}

// WritePreferences writes pairs as JSONL in TRL's preference format, one {"prompt", "chosen", "rejected"} object
// per line (strings, or message lists), the file ReadPreferences reads back.
func WritePreferences(w io.Writer, pairs []Preference) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	value := func(t Text) any {
		if t.Conversational() {
			return t.Messages
		}
		return t.String
	}
	for _, p := range pairs {
		row := struct {
			Prompt   any `json:"prompt"`
			Chosen   any `json:"chosen"`
			Rejected any `json:"rejected"`
		}{value(p.Prompt), value(p.Chosen), value(p.Rejected)}
		if err := enc.Encode(row); err != nil {
			return err
		}
	}
	return nil
}

// article is "a ROLE" or "an ROLE" (an assistant).
func article(role string) string {
	if role != "" && strings.ContainsRune("aeiou", rune(role[0])) {
		return "an " + role
	}
	return "a " + role
}
