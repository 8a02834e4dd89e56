package tokenizer_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/tokentest"
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
			starts, ends := tokentest.DecodedOffsets(t, tok, ids, text)
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

// insideGroup reports whether p falls strictly inside the span that several tokens share in
// tokentest.DecodedOffsets.
func insideGroup(starts, ends []int, p int) bool {
	for j := 1; j < len(starts); j++ {
		if starts[j] == starts[j-1] && ends[j] == ends[j-1] && starts[j] < p && p < ends[j] {
			return true
		}
	}
	return false
}
