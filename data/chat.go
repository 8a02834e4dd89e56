package data

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Kinds of JSONL training rows (JSONLKind).
const (
	// KindAlpaca rows are Alpaca instructions: {"instruction", "input", "output"}.
	KindAlpaca = "alpaca"
	// KindMessages rows are conversations: {"messages": [{"role", "content"}, ...]} (the OpenAI form), or
	// ShareGPT's {"conversations": [{"from", "value"}, ...]}.
	KindMessages = "messages"
	// KindPreference rows are preference pairs: {"prompt", "chosen", "rejected"} (TRL's preference form, the
	// prompt optional; see ReadPreferences).
	KindPreference = "preference"
)

// Message is one turn of a conversation: Role is system, user or assistant. It has the fields of
// tokenizer.Message, so one converts to the other.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Conversation is one training conversation and the line of the file it was read from (1-based; 0 when it
// came from elsewhere).
type Conversation struct {
	Messages []Message
	Line     int
}

// shareGPTRoles maps ShareGPT's "from" values to roles.
var shareGPTRoles = map[string]string{"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}

// rowKind tells the kind of a JSONL row from its keys ("" when it is neither).
func rowKind(keys map[string]json.RawMessage) string {
	if _, ok := keys["messages"]; ok {
		return KindMessages
	}
	if _, ok := keys["conversations"]; ok {
		return KindMessages
	}
	_, chosen := keys["chosen"]
	_, rejected := keys["rejected"]
	if chosen || rejected {
		return KindPreference
	}
	_, in := keys["instruction"]
	_, out := keys["output"]
	if in || out {
		return KindAlpaca
	}
	return ""
}

// kindNames says what a row of each kind looks like, for messages.
var kindNames = map[string]string{
	KindAlpaca:     "an Alpaca row (instruction, input, output)",
	KindMessages:   `a conversation ("messages": [{"role", "content"}, ...])`,
	KindPreference: `a preference pair ("prompt", "chosen", "rejected")`,
}

// decodeRow reads one JSONL line as one JSON object (its keys), or says what is wrong with it.
func decodeRow(text string) (map[string]json.RawMessage, error) {
	var keys map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(&keys); err != nil || keys == nil {
		if err == nil {
			err = errors.New("null")
		}
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON object (one JSON object per line)")
	}
	return keys, nil
}

// JSONLKind returns the kind of the JSONL training file at path (KindAlpaca, KindMessages or KindPreference), from its first
// non-blank line: the kind of every other row must be the same (ReadInstructions and ReadConversations refuse
// a row of the other kind). A first row of neither kind is an error naming the file and line.
func JSONLKind(path string) (string, error) {
	kind := ""
	errStop := errors.New("stop")
	err := EachFileLine(path, func(line int, text string) error {
		if strings.TrimSpace(text) == "" {
			return nil
		}
		keys, err := decodeRow(text)
		if err != nil {
			return fmt.Errorf("%s:%d: %v", path, line, err)
		}
		if kind = rowKind(keys); kind == "" {
			return fmt.Errorf("%s:%d: neither %s, %s nor %s", path, line, kindNames[KindAlpaca], kindNames[KindMessages], kindNames[KindPreference])
		}
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) {
		return "", err
	}
	if kind == "" {
		return "", fmt.Errorf("%s: no rows", path)
	}
	return kind, nil
}

// mixedKind is the error for a row of kind other than the file's (want), at path:line.
func mixedKind(path string, line int, got, want string) error {
	return fmt.Errorf("%s:%d: %s in a file of %s rows: one data kind per file (split the file, or convert the rows)",
		path, line, kindNames[got], want)
}

// ReadConversations reads a JSONL file of conversations, one per non-blank line: {"messages": [{"role":
// "system"|"user"|"assistant", "content": "..."}, ...]} (the OpenAI form) or ShareGPT's {"conversations":
// [{"from": "system"|"human"|"gpt", "value": "..."}, ...]} (human is the user, gpt the assistant). Other keys of
// a row are ignored. Every conversation is checked (CheckConversation); a row that is not one (an Alpaca row
// included: one kind per file), a bad message or a line longer than MaxLineBytes is an error naming the file and
// line.
func ReadConversations(path string) ([]Conversation, error) {
	var out []Conversation
	err := EachFileLine(path, func(line int, text string) error {
		if strings.TrimSpace(text) == "" {
			return nil
		}
		msgs, err := parseConversation(text)
		if err != nil {
			var mixed kindError
			if errors.As(err, &mixed) {
				return mixedKind(path, line, mixed.kind, KindMessages)
			}
			return fmt.Errorf("%s:%d: %v", path, line, err)
		}
		out = append(out, Conversation{Messages: msgs, Line: line})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no conversations", path)
	}
	return out, nil
}

// kindError says that a row is of another kind than the file's.
type kindError struct{ kind string }

func (e kindError) Error() string { return "a row of kind " + e.kind }

// parseConversation reads one JSONL row as a checked conversation.
func parseConversation(text string) ([]Message, error) {
	keys, err := decodeRow(text)
	if err != nil {
		return nil, err
	}
	kind := rowKind(keys)
	if kind == KindAlpaca || kind == KindPreference {
		return nil, kindError{kind}
	}
	if kind == "" {
		return nil, fmt.Errorf("neither %s nor %s", kindNames[KindMessages], kindNames[KindAlpaca])
	}
	listKey, roleKey, contentKey := "messages", "role", "content"
	raw, ok := keys["messages"]
	if !ok {
		listKey, roleKey, contentKey = "conversations", "from", "value"
		raw = keys["conversations"]
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("%q must be a list of objects with %q and %q", listKey, roleKey, contentKey)
	}
	msgs := make([]Message, len(items))
	for i, it := range items {
		role, err := jsonString(it[roleKey])
		if err != nil {
			return nil, fmt.Errorf("message %d: %q must be a string (%v)", i+1, roleKey, err)
		}
		if listKey == "conversations" {
			r, ok := shareGPTRoles[role]
			if !ok {
				return nil, fmt.Errorf("message %d: \"from\" %q: use system, human or gpt", i+1, role)
			}
			role = r
		}
		content, err := jsonString(it[contentKey])
		if err != nil {
			return nil, fmt.Errorf("message %d (%s): %q must be a string (%v): memfit trains on text; a list of content parts is not read", i+1, role, contentKey, err)
		}
		msgs[i] = Message{Role: role, Content: content}
	}
	if err := CheckConversation(msgs); err != nil {
		return nil, err
	}
	return msgs, nil
}

// jsonString decodes a JSON string, naming what the value is instead when it is not one.
func jsonString(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", errors.New("missing")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || raw[0] != '"' { // null decodes into a string without error
		what := "a number"
		switch raw[0] {
		case '[':
			what = "a list"
		case '{':
			what = "an object"
		case 'n':
			what = "null"
		case 't', 'f':
			what = "a boolean"
		}
		return "", errors.New("got " + what)
	}
	return s, nil
}

// CheckConversation checks a training conversation: at least one message, roles system, user or assistant, a
// system message only first, no message whose content is empty (or only white space), and at least one
// assistant turn (the replies are what the model learns).
func CheckConversation(msgs []Message) error {
	if len(msgs) == 0 {
		return errors.New("the conversation has no messages")
	}
	assistant := false
	for i, m := range msgs {
		switch m.Role {
		case "system":
			if i > 0 {
				return fmt.Errorf("message %d: a system message goes first, before the conversation's turns", i+1)
			}
		case "user":
		case "assistant":
			assistant = true
		default:
			return fmt.Errorf("message %d: role %q: use system, user or assistant", i+1, m.Role)
		}
		if strings.TrimSpace(m.Content) == "" {
			return fmt.Errorf("message %d (%s) has empty content", i+1, m.Role)
		}
	}
	if !assistant {
		return errors.New("the conversation has no assistant turn: training learns the assistant's replies, give at least one")
	}
	return nil
}
