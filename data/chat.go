package data

import (
	"bytes"
	"encoding/json"
	"encoding/json/jsontext"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
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

// Conversation is one training conversation and where it was read from: the line of a JSONL file (1-based; 0
// when it came from elsewhere), or Where ("FILE: row N" for a parquet row), which messages then name instead.
type Conversation struct {
	Messages []Message
	Line     int
	Where    string
}

// shareGPTRoles maps ShareGPT's "from" values to roles.
var shareGPTRoles = map[string]string{"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}

// toolRoles are the speakers of tool calls and their results (OpenAI's tool and function roles, ShareGPT's
// function_call and observation): memfit trains on text replies and does not read them.
var toolRoles = []string{"tool", "function", "function_call", "observation", "ipython"}

// errToolCalls is the end of the message for a tool-call turn.
const errToolCalls = "tool calls are not read (memfit trains on the assistant's text replies): remove the tool-call turns and their results from the conversation"

// ShareGPTRole returns the role of a ShareGPT speaker ("from": human is the user, gpt the assistant, system), or
// an error in ShareGPT's own words for one that is not one of them.
func ShareGPTRole(from string) (string, error) {
	if r, ok := shareGPTRoles[from]; ok {
		return r, nil
	}
	if slices.Contains(toolRoles, from) {
		return "", fmt.Errorf("\"from\" %q: %s", from, errToolCalls)
	}
	return "", fmt.Errorf("\"from\" %q: use system, human or gpt", from)
}

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

// decodeRow reads one JSONL line as one JSON object (its keys), or says what is wrong with it: not an object (a
// JSON array file is named as one), a key given twice at any depth (the row would mean what its last copy says,
// as a config file's would: refused as config files are), trailing data.
func decodeRow(text string) (map[string]json.RawMessage, error) {
	trimmed := strings.TrimSpace(text)
	if strings.HasPrefix(trimmed, "[") {
		return nil, errors.New("a JSON array, not an object: memfit reads JSONL, one JSON object per line (convert a JSON array file with: jq -c '.[]' FILE.json > FILE.jsonl)")
	}
	if err := duplicateKey(trimmed); err != nil {
		return nil, err
	}
	var keys map[string]json.RawMessage
	dec := json.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(&keys); err != nil || keys == nil {
		what := "null"
		if err != nil {
			what = jsonSyntax(err)
		}
		return nil, fmt.Errorf("not a JSON object: %s", what)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the JSON object (one JSON object per line)")
	}
	return keys, nil
}

// jsonSyntax says what a JSON decoding error found, without Go's type names: "a string", "a number", or the
// syntax error.
func jsonSyntax(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return "the line is " + map[string]string{"array": "a list", "string": "a string", "number": "a number", "bool": "a boolean"}[te.Value]
	}
	return err.Error()
}

// duplicateKey returns an error naming the first object key given twice in the JSON value text (at any depth), or
// nil (also for text that is not valid JSON: the decoder says what is wrong with it).
func duplicateKey(text string) error {
	_, err := jsontext.NewDecoder(strings.NewReader(text)).ReadValue() // duplicate names are refused by default
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) || !errors.Is(se.Err, jsontext.ErrDuplicateName) {
		return nil
	}
	name, where := se.JSONPointer.LastToken(), ""
	var path []string
	for tok := range se.JSONPointer.Parent().Tokens() {
		path = append(path, tok)
	}
	if len(path) == 2 && (path[0] == "messages" || path[0] == "conversations") {
		if i, err := strconv.Atoi(path[1]); err == nil {
			where = fmt.Sprintf(" in message %d", i+1)
		}
	} else if len(path) > 0 {
		where = fmt.Sprintf(" in %q", strings.Join(path, "/"))
	}
	return fmt.Errorf("key %q is given twice%s: keep one", name, where)
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
			if role, err = ShareGPTRole(role); err != nil {
				return nil, fmt.Errorf("message %d: %v", i+1, err)
			}
		}
		if slices.Contains(toolRoles, role) {
			return nil, fmt.Errorf("message %d: role %q (a tool's turn): %s", i+1, role, errToolCalls)
		}
		for _, key := range []string{"tool_calls", "function_call"} {
			if v, ok := it[key]; ok && string(bytes.TrimSpace(v)) != "null" {
				return nil, fmt.Errorf("message %d (%s) holds %q: %s", i+1, role, key, errToolCalls)
			}
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

// EmptyReply reports whether a conversation has an assistant reply that is empty (or only white space).
func EmptyReply(msgs []Message) bool {
	for _, m := range msgs {
		if m.Role == "assistant" && strings.TrimSpace(m.Content) == "" {
			return true
		}
	}
	return false
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
// system message only first, no system or user message whose content is empty (or only white space), and at
// least one assistant turn (the replies are what the model learns). An empty assistant reply passes: it is an
// example with an empty reply (EmptyReply), which training leaves out and counts, as it does an Alpaca row with
// an empty output.
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
			if slices.Contains(toolRoles, m.Role) {
				return fmt.Errorf("message %d: role %q (a tool's turn): %s", i+1, m.Role, errToolCalls)
			}
			return fmt.Errorf("message %d: role %q: use system, user or assistant", i+1, m.Role)
		}
		if strings.TrimSpace(m.Content) == "" && m.Role != "assistant" {
			return fmt.Errorf("message %d (%s) has empty content", i+1, m.Role)
		}
	}
	if !assistant {
		return errors.New("the conversation has no assistant turn: training learns the assistant's replies, give at least one")
	}
	return nil
}
