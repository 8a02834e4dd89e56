package tokenizer

import (
	"strings"
	"testing"
)

// TestUnigramVocabChecked: a Unigram model with an empty vocab, or an unk_id outside its vocab, is refused when
// parsed (they produced ids -1 and 7 for a 2-piece vocab).
func TestUnigramVocabChecked(t *testing.T) {
	for js, want := range map[string]string{
		`{"model":{"type":"Unigram","vocab":[]}}`:                                  "vocab is empty",
		`{"model":{"type":"Unigram","vocab":[["h",-1.0],["x",-2.0]],"unk_id":7}}`:  "unk_id 7",
		`{"model":{"type":"Unigram","vocab":[["h",-1.0],["x",-2.0]],"unk_id":-1}}`: "unk_id -1",
	} {
		if _, err := Parse([]byte(js)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", js, err, want)
		}
	}
	if _, err := Parse([]byte(`{"model":{"type":"Unigram","vocab":[["h",-1.0],["x",-2.0]],"unk_id":1}}`)); err != nil {
		t.Errorf("a good unigram: %v", err)
	}
}
