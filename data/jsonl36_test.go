package data

import (
	"reflect"
	"strings"
	"testing"
)

// Issue 36's probe, section 2: JSONL rows whose message named the wrong cause or accepted a row it misread.

// TestDuplicateKeysRefused (cv_dup_key_messages, cv_dup_key_content): a key given twice in a data row is refused
// as config files refuse one; before, the row meant what its last copy said ("no assistant turn" for a second
// "messages" list, and training on "b" for {"content": "a", "content": "b"}).
func TestDuplicateKeysRefused(t *testing.T) {
	for _, c := range []struct{ row, want string }{
		{`{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"messages":[{"role":"user","content":"c"}]}`, `x.jsonl:1: key "messages" is given twice: keep one`},
		{`{"messages":[{"role":"user","content":"a","content":"b"},{"role":"assistant","content":"c"}]}`, `x.jsonl:1: key "content" is given twice in message 1: keep one`},
		{`{"conversations":[{"from":"human","value":"a"},{"from":"gpt","from":"human","value":"c"}]}`, `x.jsonl:1: key "from" is given twice in message 2`},
	} {
		_, err := ReadConversations(writeJSONL(t, c.row))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.row, err, c.want)
		}
	}
	for _, c := range []struct{ row, want string }{
		{`{"instruction":"a","output":"b","output":"c"}`, `x.jsonl:1: key "output" is given twice: keep one`},
		{`{"instruction":"a","input":{"x":1,"x":2},"output":"b"}`, `x.jsonl:1: key "x" is given twice in "input"`},
	} {
		_, err := ReadInstructions(writeJSONL(t, c.row))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.row, err, c.want)
		}
	}
}

// TestJSONLShapesNamed (cv_array_file, cv_bom, cv_tool_calls): a JSON array file is named as one (it was "cannot
// unmarshal array into Go value of type map[string]jsontext.Value"); a UTF-8 byte-order mark is read past (it was
// "invalid character '\ufeff'"); a tool call is named (it was "message 2 (assistant) has empty content"); an
// Alpaca field of another type is named in words, not Go's.
func TestJSONLShapesNamed(t *testing.T) {
	conv := `{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."}]}`
	got, err := ReadConversations(writeJSONL(t, "\ufeff"+conv))
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0].Messages, []Message{{"user", "Hi"}, {"assistant", "Hello."}}) {
		t.Errorf("a file with a byte-order mark: %v, %v", got, err)
	}
	if k, err := JSONLKind(writeJSONL(t, "\ufeff"+`{"instruction":"a","output":"b"}`)); k != KindAlpaca || err != nil {
		t.Errorf("kind of a file with a byte-order mark: %q, %v", k, err)
	}
	if rows, err := ReadInstructions(writeJSONL(t, "\ufeff"+`{"instruction":"a","output":"b"}`)); err != nil || len(rows) != 1 {
		t.Errorf("Alpaca with a byte-order mark: %v, %v", rows, err)
	}
	for _, c := range []struct {
		read func(string) error
		rows []string
		want string
	}{
		{convs, []string{"[" + conv + "," + conv + "]"}, `x.jsonl:1: a JSON array, not an object: memfit reads JSONL, one JSON object per line (convert a JSON array file with: jq -c '.[]' FILE.json > FILE.jsonl)`},
		{alpaca, []string{`[`, `  {"instruction": "a", "output": "b"}`, `]`}, `x.jsonl:1: a JSON array, not an object`},
		{convs, []string{`{"messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","content":"sunny"},{"role":"assistant","content":"Sunny."}]}`},
			`x.jsonl:1: message 2 (assistant) holds "tool_calls": tool calls are not read (memfit trains on the assistant's text replies)`},
		{convs, []string{`{"messages":[{"role":"user","content":"weather?"},{"role":"tool","content":"sunny"},{"role":"assistant","content":"Sunny."}]}`},
			`x.jsonl:1: message 2: role "tool" (a tool's turn): tool calls are not read`},
		{convs, []string{`{"conversations":[{"from":"human","value":"weather?"},{"from":"function_call","value":"{}"},{"from":"gpt","value":"Sunny."}]}`},
			`x.jsonl:1: message 2: "from" "function_call": tool calls are not read`},
		{alpaca, []string{`{"instruction": 5, "output": "b"}`}, `x.jsonl:1: "instruction" must be a string (got a number)`},
		{alpaca, []string{`{"instruction": "a", "input": ["x"], "output": "b"}`}, `x.jsonl:1: "input" must be a string (got a list)`},
		{alpaca, []string{`"just text"`}, `x.jsonl:1: not a JSON object: the line is a string`},
	} {
		err := c.read(writeJSONL(t, c.rows...))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "Go value") {
			t.Errorf("%s: %v, want %q", c.rows, err, c.want)
		}
	}
}

func convs(p string) error  { _, err := ReadConversations(p); return err }
func alpaca(p string) error { _, err := ReadInstructions(p); return err }
