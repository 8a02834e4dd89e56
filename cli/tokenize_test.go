package cli_test

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestTokenize(t *testing.T) {
	tok := filepath.Join("..", "pretrained", "llama-tiny")
	out, errOut, code := run(t, "tokenize", "--tokenizer", tok, "Hello world", "")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one JSON line per text:\n%s", out)
	}
	var first struct {
		Text string `json:"text"`
		IDs  []int  `json:"ids"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first.Text != "Hello world" || first.IDs[0] != 4093 {
		t.Fatalf("%q: %v", lines[0], err)
	}
	if lines[1] != `{"text":"","ids":[4093]}` {
		t.Errorf("empty text: %s", lines[1])
	}
	ids, _ := json.Marshal(first.IDs)
	out, errOut, code = run(t, "tokenize", "--tokenizer", tok, "--decode", "--skip-special", string(ids))
	var dec struct {
		IDs  []int  `json:"ids"`
		Text string `json:"text"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &dec) != nil || dec.Text != "Hello world" || !reflect.DeepEqual(dec.IDs, first.IDs) {
		t.Errorf("decode: exit %d, %q, %s", code, out, errOut)
	}
	out, _, _ = run(t, "tokenize", "--tokenizer", tok, "--no-special", "Hello world")
	if strings.Contains(out, "4093") {
		t.Errorf("--no-special still adds BOS: %s", out)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"tokenize", "x"}, 2, "--tokenizer is required"},
		{[]string{"tokenize", "--tokenizer", "/nonexistent", "x"}, 1, "does not exist"},
		{[]string{"tokenize", "--tokenizer", tok, "--decode", "1 two"}, 2, "not a token id"},
	} {
		_, errOut, code := run(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q", tc.args, code, errOut)
		}
	}
}
