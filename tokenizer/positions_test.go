package tokenizer_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/tokenizer"
)

// TestEncodeAt: EncodeAt gives Encode's ids, and each position's boundary agrees with an independent offset
// computation: every token's bytes of the text found by decoding the tokens one after another (the text is
// the concatenation of the decoded tokens, a SentencePiece tokenizer's prepended space aside). Checked at every
// byte position on byte-level BPE (Llama-3) and SentencePiece-style BPE with byte fallback (Mistral), with
// added tokens, multi-byte characters, emoji (byte fallback) and runs of spaces and newlines.
func TestEncodeAt(t *testing.T) {
	texts := []string{
		"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi  there,\tfriend!<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\n« chat » — 猫 😀\nline two<|eot_id|>",
		"<s> [INST] How do you say \"cat\"? [/INST] Le chat 😀\n\n  ok </s> [INST] merci [/INST]",
		"plain text with no added token, 12345 and ünïcödé",
	}
	for _, name := range []string{"llama3", "mistral"} {
		tok, err := tokenizer.Load(filepath.Join(golden.SharedDir(t), "tokenizers", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, text := range texts {
			var positions []int // every character boundary (a template's spans never cut a character)
			for i := range text {
				positions = append(positions, i)
			}
			positions = append(positions, len(text))
			ids, bounds, err := tok.EncodeAt(text, positions)
			if err != nil {
				t.Fatal(err)
			}
			if want := tok.Encode(text, false); !slices.Equal(ids, want) {
				t.Fatalf("%s: EncodeAt's ids %v differ from Encode's %v", name, ids, want)
			}
			starts, ends := decodedOffsets(t, tok, ids, text)
			for k, p := range positions {
				if insideGroup(starts, ends, p) {
					continue // inside a character spelled by several tokens: decoding cannot say where each ends
				}
				before, started := 0, 0
				for j := range ids {
					if ends[j] <= p {
						before = j + 1
					}
					if starts[j] < p {
						started = j + 1
					}
				}
				if bounds[k] != (tokenizer.Boundary{Before: before, Started: started}) {
					t.Fatalf("%s %q position %d: %+v, want {Before:%d Started:%d}", name, text, p, bounds[k], before, started)
				}
			}
		}
	}
	tok, err := tokenizer.Load(filepath.Join(golden.SharedDir(t), "tokenizers", "llama3"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tok.EncodeAt("abc", []int{4}); err == nil {
		t.Error("a position past the text is accepted")
	}
}

func spaces(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }

// insideGroup reports whether p falls strictly inside the span that several tokens share in decodedOffsets.
func insideGroup(starts, ends []int, p int) bool {
	for j := 1; j < len(starts); j++ {
		if starts[j] == starts[j-1] && ends[j] == ends[j-1] && starts[j] < p && p < ends[j] {
			return true
		}
	}
	return false
}

// decodedOffsets returns each token's byte span in text by decoding the tokens one by one: the decoded text
// of ids[:j+1] is a prefix of the decoding of all of them, which is aligned with text (a space the tokenizer
// inserted, SentencePiece's prepended "▁" at the start of a stretch of text, matches nothing). Tokens that
// decode to part of a character (a byte-fallback byte, a byte-level token cut inside a character) share the
// character's span.
func decodedOffsets(t *testing.T, tok *tokenizer.Tokenizer, ids []int, text string) (starts, ends []int) {
	t.Helper()
	all := tok.Decode(ids, false)
	at := make([]int, len(all)+1) // position in text of each byte of the decoding
	inserted := make([]bool, len(all))
	j := 0
	for i := 0; i < len(all); i++ {
		at[i] = j
		switch {
		case all[i] == ' ' && spaces(all[i:]) > spaces(text[j:]):
			// inserted: the first space of a run longer than the text's (Hugging Face aligns a prepended
			// "▁" with the character it precedes)
			inserted[i] = true
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
