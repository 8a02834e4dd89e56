package data

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/fuzzfile"
)

func writeJSONL(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadConversations reads the OpenAI and ShareGPT forms to the same messages (blank lines skipped, other
// keys ignored, lines numbered as in the file) and tells the file's kind from its first row.
func TestReadConversations(t *testing.T) {
	p := writeJSONL(t,
		`{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}], "id": 7}`,
		``,
		`{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}`)
	convs, err := ReadConversations(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}}
	if len(convs) != 2 || !reflect.DeepEqual(convs[0].Messages, want) || !reflect.DeepEqual(convs[1].Messages, want) ||
		convs[0].Line != 1 || convs[1].Line != 3 {
		t.Errorf("got %+v", convs)
	}
	if k, err := JSONLKind(p); err != nil || k != KindMessages {
		t.Errorf("kind %q, %v", k, err)
	}
	if k, err := JSONLKind(writeJSONL(t, ``, `{"instruction": "a", "output": "b"}`)); err != nil || k != KindAlpaca {
		t.Errorf("kind %q, %v", k, err)
	}
}

// TestConversationErrors: each bad row is refused naming its file, line and cause.
func TestConversationErrors(t *testing.T) {
	good := `{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}`
	for _, c := range []struct{ row, want string }{
		{`{"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "x"}]}`, `:2: message 2: role "bot": use system, user or assistant`},
		{`{"messages": [{"role": "user", "content": "Hi"}]}`, ":2: the conversation has no assistant turn"},
		{`{"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}]}`, ":2: message 1 (user) has empty content"},
		{`{"messages": [{"role": "user", "content": null}, {"role": "assistant", "content": "x"}]}`, `:2: message 1 (user): "content" must be a string (got null)`},
		{`{"messages": [{"role": "user", "content": {"text": "Hi"}}, {"role": "assistant", "content": "x"}]}`, `(got an object)`},
		{`{"messages": [{"role": "user", "content": true}, {"role": "assistant", "content": "x"}]}`, `(got a boolean)`},
		{`{"messages": [{"role": 1, "content": "Hi"}, {"role": "assistant", "content": "x"}]}`, `:2: message 1: "role" must be a string (got a number)`},
		{`{"messages": [{"content": "Hi"}, {"role": "assistant", "content": "x"}]}`, `:2: message 1: "role" must be a string (missing)`},
		{`{"messages": [1, 2]}`, `:2: "messages" must be a list of objects`},
		{`{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt"}]}`, `:2: message 2 (assistant): "value" must be a string (missing)`},
		{`{"instruction": "a", "output": "b"}`, ":2: an Alpaca row (instruction, input, output) in a file of messages rows: one data kind per file"},
		{`{"prompt": "Hi"}`, ":2: neither a conversation"},
		{`[1]`, ":2: a JSON array, not an object: memfit reads JSONL"},
		{`null`, ":2: not a JSON object"},
		{good + ` {}`, ":2: trailing data after the JSON object"},
	} {
		_, err := ReadConversations(writeJSONL(t, good, c.row))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.row, err, c.want)
		}
	}
	if _, err := ReadInstructions(writeJSONL(t, `{"instruction": "a", "output": "b"}`, good)); err == nil ||
		!strings.Contains(err.Error(), `:2: a conversation ("messages": [{"role", "content"}, ...]) in a file of alpaca rows`) {
		t.Errorf("conversation in an Alpaca file: %v", err)
	}
	if _, err := JSONLKind(writeJSONL(t, `{"text": "x"}`)); err == nil || !strings.Contains(err.Error(), ":1: neither an Alpaca row") {
		t.Errorf("unknown first row: %v", err)
	}
	if _, err := JSONLKind(writeJSONL(t, ``)); err == nil || !strings.Contains(err.Error(), "no rows") {
		t.Errorf("empty file: %v", err)
	}
}

// TestPackExamples packs by hand-checked example: three examples of 5, 3 and 2 tokens into sequences of 6 go
// first-fit decreasing as [5] and [3, 2]; positions restart at each example, each example's first label is
// ignored, padding is its own segment with mask 0 and labels ignored.
func TestPackExamples(t *testing.T) {
	ids := [][]int{{1, 2, 3, 4, 5}, {6, 7, 8}, {9, 10}}
	labels := [][]int{{-100, -100, 3, 4, 5}, {6, 7, 8}, {-100, 10}}
	p, err := PackExamples(ids, labels, 6, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.Rows != 2 || p.Docs != 3 || p.RealTokens != 10 {
		t.Fatalf("%+v", p)
	}
	flat := func(name string) []int32 {
		v := p.Tensors[name].Value().([][]int32)
		return append(append([]int32(nil), v[0]...), v[1]...)
	}
	for name, want := range map[string][]int32{
		"input_ids":      {1, 2, 3, 4, 5, 0, 6, 7, 8, 9, 10, 0},
		"attention_mask": {1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0},
		"labels":         {-100, -100, 3, 4, 5, -100, -100, 7, 8, -100, 10, -100},
		"position_ids":   {0, 1, 2, 3, 4, 0, 0, 1, 2, 0, 1, 0},
	} {
		if got := flat(name); !reflect.DeepEqual(got, want) {
			t.Errorf("%s %v, want %v", name, got, want)
		}
	}
	if _, err := PackExamples([][]int{{1, 2, 3}}, [][]int{{1, 2, 3}}, 2, 0); err == nil {
		t.Error("an example longer than the sequence was packed")
	}
}

func FuzzConversations(f *testing.F) {
	f.Add([]byte(`{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}` + "\n"))
	f.Add([]byte(`{"conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}]}` + "\n"))
	f.Add([]byte(`{"messages": [{"role": "user", "content": [1]}]}` + "\n{oops\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		path := fuzzfile.Write("c.jsonl", raw)
		_, _ = JSONLKind(path)
		convs, err := ReadConversations(path)
		if err == nil {
			for _, c := range convs {
				if CheckConversation(c.Messages) != nil {
					t.Fatalf("line %d: a conversation read that its check refuses", c.Line)
				}
			}
		}
	})
}
