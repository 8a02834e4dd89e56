// Package tokentest holds test helpers over tokenizers: an independent offset computation that tests of
// tokenizer.EncodeAt and of chat-template masks check against.
package tokentest

import (
	"strings"
	"testing"

	"github.com/memfit/memfit/tokenizer"
)

// DecodedOffsets returns each token's byte span in text, found without the tokenizer's pipeline: the tokens are
// decoded one by one (the decoding of ids[:k+1] is a prefix of the decoding of all of them), and that decoding
// is aligned with text, a space the tokenizer inserted (SentencePiece's prepended "▁" at the start of a stretch
// of text) matching nothing and covering the character it precedes, as Hugging Face aligns it. Tokens that
// decode to part of a character (a byte-fallback byte, a byte-level token cut inside a character) share the
// span of the tokens up to the character's end.
func DecodedOffsets(t testing.TB, tok *tokenizer.Tokenizer, ids []int, text string) (starts, ends []int) {
	t.Helper()
	all := tok.Decode(ids, false)
	at := make([]int, len(all)+1) // position in text of each byte of the decoding
	inserted := make([]bool, len(all))
	j := 0
	for i := 0; i < len(all); i++ {
		at[i] = j
		switch {
		case all[i] == ' ' && leadingSpaces(all[i:]) > leadingSpaces(text[j:]):
			inserted[i] = true // the first space of a run longer than the text's
		case j < len(text) && all[i] == text[j]:
			j++
		default:
			t.Fatalf("the decoding %q does not align with %q at byte %d", all, text, i)
		}
	}
	at[len(all)] = j
	if j != len(text) {
		t.Fatalf("the decoding %q covers %d of the %d bytes of %q", all, j, len(text), text)
	}
	starts, ends = make([]int, len(ids)), make([]int, len(ids))
	prevLen := 0 // bytes of the decoding before the pending tokens
	var pending []int
	for k := range ids {
		dec := tok.Decode(ids[:k+1], false)
		if strings.HasSuffix(dec, "\uFFFD") && !strings.Contains(text, "\uFFFD") {
			pending = append(pending, k) // an incomplete character: its bytes come with the next tokens
			continue
		}
		if !strings.HasPrefix(all, dec) {
			t.Fatalf("decoding %d tokens gives %q, not a prefix of %q", k+1, dec, all)
		}
		end := at[len(dec)]
		if len(dec) > 0 && inserted[len(dec)-1] {
			end++ // an inserted space covers the character it precedes
		}
		for _, p := range append(pending, k) {
			starts[p], ends[p] = at[prevLen], end
		}
		pending = pending[:0]
		prevLen = len(dec)
	}
	return starts, ends
}

func leadingSpaces(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }
