package tokenizer

import (
	"fmt"
	"sort"
	"strings"
)

// Boundary locates a position of a text among the tokens of its encoding (EncodeAt): Before tokens end at or
// before it (tokens [0, Before) hold only text before the position) and Started tokens begin before it (tokens
// [Started, n) hold only text from the position on). Before == Started when the position falls between two
// tokens; a token that straddles the position counts in Started but not in Before.
type Boundary struct {
	Before, Started int
}

// EncodeAt encodes text as Encode(text, false) does (the same ids) and locates each byte position of
// positions among its tokens, so that spans of the text (a chat template's assistant turns) map to the tokens
// that hold them, as Hugging Face's offset mapping (char_to_token) maps them. Added tokens cover exactly their
// bytes (with the whitespace their lstrip/rstrip absorbed); a position inside a stretch of ordinary text is
// mapped through the normalizer and pre-tokenizer: the bytes of the pre-tokenized prefix up to the position
// against the bytes each token spells (a byte-fallback <0xXX> token spells one). A piece whose tokens do not
// spell it byte for byte (an unknown token, a WordPiece continuation) is mapped as a whole: its tokens start
// where the piece starts and end where it ends. Positions must lie in [0, len(text)].
func (t *Tokenizer) EncodeAt(text string, positions []int) ([]int, []Boundary, error) {
	for _, p := range positions {
		if p < 0 || p > len(text) {
			return nil, nil, fmt.Errorf("position %d outside the text (%d bytes)", p, len(text))
		}
	}
	bounds := make([]Boundary, len(positions))
	var ids []int
	for _, seg := range t.added.split(text) {
		first := len(ids)
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			for i, p := range positions {
				if seg.end <= p {
					bounds[i].Before = len(ids)
				}
				if seg.start < p {
					bounds[i].Started = len(ids)
				}
			}
			continue
		}
		spans := t.encodeSegment(seg.text, &ids) // each token's bytes in the pre-tokenized text
		for i, p := range positions {
			switch {
			case p >= seg.end:
				bounds[i].Before, bounds[i].Started = len(ids), len(ids)
			case p > seg.start:
				at := t.preTokenizedLen(seg.text[:p-seg.start])
				// tokens ending at or before at, and tokens starting before at (spans are in order)
				bounds[i].Before = first + sort.Search(len(spans), func(j int) bool { return spans[j][1] > at })
				bounds[i].Started = first + sort.Search(len(spans), func(j int) bool { return spans[j][0] >= at })
			}
		}
	}
	return ids, bounds, nil
}

// encodeSegment appends the ids of a stretch of text without added tokens (encodeText's pipeline) and returns
// each new token's byte span in the concatenation of the pre-tokenized pieces.
func (t *Tokenizer) encodeSegment(s string, ids *[]int) [][2]int {
	if t.normalizer != nil {
		s = t.normalizer.normalize(s)
	}
	if s == "" {
		return nil
	}
	pieces := []string{s}
	if t.pre != nil {
		pieces = t.pre.split(pieces)
	}
	var spans [][2]int
	off := 0
	for _, p := range pieces {
		if p == "" {
			continue
		}
		first := len(*ids)
		*ids = t.model.tokenize(p, *ids)
		var own [][2]int
		pos := off
		for _, id := range (*ids)[first:] {
			n := t.spelledLen(id)
			if n < 0 {
				break
			}
			own = append(own, [2]int{pos, pos + n})
			pos += n
		}
		if len(own) != len(*ids)-first || pos != off+len(p) {
			own = own[:0] // not spelled byte for byte: every token of the piece covers the whole piece
			for range (*ids)[first:] {
				own = append(own, [2]int{off, off + len(p)})
			}
		}
		spans = append(spans, own...)
		off += len(p)
	}
	return spans
}

// spelledLen is the number of pre-tokenized bytes a token spells: its vocabulary entry, or one byte for a
// byte-fallback <0xXX> token; -1 when unknown (the unknown token).
func (t *Tokenizer) spelledLen(id int) int {
	if id == t.unk || id < 0 || id >= len(t.idToToken) {
		return -1
	}
	tok := t.idToToken[id]
	if len(tok) == 6 && strings.HasPrefix(tok, "<0x") && tok[5] == '>' {
		return 1
	}
	return len(tok)
}

// preTokenizedLen is the length in bytes of the pre-tokenized pieces of a text without added tokens, joined.
func (t *Tokenizer) preTokenizedLen(s string) int {
	if t.normalizer != nil {
		s = t.normalizer.normalize(s)
	}
	if s == "" {
		return 0
	}
	pieces := []string{s}
	if t.pre != nil {
		pieces = t.pre.split(pieces)
	}
	n := 0
	for _, p := range pieces {
		n += len(p)
	}
	return n
}
