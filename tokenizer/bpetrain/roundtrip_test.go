package bpetrain_test

import (
	"strings"
	"testing"

	"github.com/memfit/memfit/tokenizer"
	"github.com/memfit/memfit/tokenizer/bpetrain"
)

// A trained tokenizer.json loads in the tokenizer package, encodes text into fewer tokens than bytes, and decodes
// back to the same text, unseen characters included (byte-level: nothing is unknown).
func TestTrainedTokenizerRoundTrip(t *testing.T) {
	corpus := strings.Repeat("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!\n", 40)
	m, err := bpetrain.Train([]string{corpus}, bpetrain.Options{VocabSize: 320, Special: []string{"<s>", "</s>"}})
	if err != nil {
		t.Fatal(err)
	}
	data, err := m.TokenizerJSON()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	bos, ok := tok.BOS()
	if !ok || bos != len(m.Vocab)-2 {
		t.Fatalf("BOS %d, %v (vocab %d)", bos, ok, len(m.Vocab))
	}
	for _, text := range []string{"The quick brown fox", "  jumps\n\nover 12345 ünseen 🦊 chars", ""} {
		ids := tok.Encode(text, true)
		if len(ids) == 0 || ids[0] != bos {
			t.Errorf("%q: no BOS first: %v", text, ids)
		}
		if got := tok.Decode(ids, true); got != text {
			t.Errorf("round trip of %q gives %q", text, got)
		}
	}
	if n := len(tok.Encode("The quick brown fox jumps over the lazy dog.", false)); n > 12 {
		t.Errorf("a training sentence takes %d tokens: the merges are not applied", n)
	}
}
