package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedVocab finds added tokens (special or not) in raw text before the normal pipeline runs, as Hugging Face's
// AddedVocabulary: the longest token wins at a position; lstrip/rstrip absorb the whitespace beside a match;
// single_word tokens match only between word boundaries.
type addedVocab struct {
	byFirst map[byte][]addedToken // candidates by first byte, longest first
}

type segment struct {
	text string
	id   int // >= 0 for an added token
	// start and end are the bytes of the input the segment covers (an added token's with the whitespace its
	// lstrip/rstrip absorbed).
	start, end int
}

func newAddedVocab(tokens []addedToken) *addedVocab {
	a := &addedVocab{byFirst: map[byte][]addedToken{}}
	for _, t := range tokens {
		if t.Content == "" {
			continue
		}
		a.byFirst[t.Content[0]] = append(a.byFirst[t.Content[0]], t)
	}
	for _, list := range a.byFirst {
		sort.SliceStable(list, func(i, j int) bool { return len(list[i].Content) > len(list[j].Content) })
	}
	return a
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' }

func (a *addedVocab) split(text string) []segment {
	if a == nil || len(a.byFirst) == 0 {
		return []segment{{text, -1, 0, len(text)}}
	}
	var out []segment
	last := 0
	for i := 0; i < len(text); i++ {
		cands := a.byFirst[text[i]]
		if cands == nil {
			continue
		}
		for _, t := range cands {
			if !strings.HasPrefix(text[i:], t.Content) {
				continue
			}
			start, end := i, i+len(t.Content)
			if t.SingleWord {
				before, _ := utf8.DecodeLastRuneInString(text[:start])
				after, _ := utf8.DecodeRuneInString(text[end:])
				if (start > 0 && isWordRune(before)) || (end < len(text) && isWordRune(after)) {
					continue
				}
			}
			if t.LStrip {
				for start > last {
					r, n := utf8.DecodeLastRuneInString(text[:start])
					if !unicode.IsSpace(r) {
						break
					}
					start -= n
				}
			}
			if t.RStrip {
				for end < len(text) {
					r, n := utf8.DecodeRuneInString(text[end:])
					if !unicode.IsSpace(r) {
						break
					}
					end += n
				}
			}
			if start > last {
				out = append(out, segment{text[last:start], -1, last, start})
			}
			out = append(out, segment{t.Content, t.ID, start, end})
			last = end
			i = end - 1
			break
		}
	}
	if last < len(text) {
		out = append(out, segment{text[last:], -1, last, len(text)})
	}
	return out
}
