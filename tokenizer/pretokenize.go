package tokenizer

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

type preTokenizer interface {
	// split cuts every piece further and returns the new pieces in order.
	split(pieces []string) []string
}

type preSeq []preTokenizer

func (s preSeq) split(p []string) []string {
	for _, x := range s {
		p = x.split(p)
	}
	return p
}

// gpt2Pattern is the GPT-2 split regex that ByteLevel's use_regex applies.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// splitter finds the matches of a tokenizer.json regex. Go's regexp has no lookahead; the one lookahead that
// Hugging Face tokenizers use (`\s+(?!\S)|\s+` at the end of the GPT-2 and Llama-3 patterns: a whitespace run
// leaves its last character to the next word) is rewritten as a capture group whose matches are shortened by
// one character when a non-space follows, which is exactly what the backtracking engine does.
type splitter struct {
	re        *regexp.Regexp
	lookahead bool
}

func newSplitter(pat string) (*splitter, error) {
	const la = `\s+(?!\S)|\s+`
	s := &splitter{}
	if strings.Contains(pat, `(?!`) || strings.Contains(pat, `(?=`) || strings.Contains(pat, `(?<`) {
		if !strings.HasSuffix(pat, la) || strings.Count(pat, "(?!") != 1 {
			return nil, fmt.Errorf("regex %q uses lookaround that memfit's splitter does not handle", pat)
		}
		pat = strings.TrimSuffix(pat, la) + `(\s+)`
		s.lookahead = true
	}
	re, err := regexp.Compile(pat)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pat, err)
	}
	s.re = re
	return s, nil
}

// matches returns the [start, end) byte ranges of the pattern's matches in x, left to right.
func (s *splitter) matches(x string) [][2]int {
	var out [][2]int
	for pos := 0; pos < len(x); {
		var loc []int
		if s.lookahead {
			loc = s.re.FindStringSubmatchIndex(x[pos:])
		} else {
			loc = s.re.FindStringIndex(x[pos:])
		}
		if loc == nil {
			break
		}
		start, end := pos+loc[0], pos+loc[1]
		if s.lookahead && len(loc) >= 4 && loc[2] >= 0 && end < len(x) {
			if _, n := utf8.DecodeLastRuneInString(x[start:end]); end-n > start {
				end -= n
			}
		}
		if end == start { // empty match: step over one character
			_, n := utf8.DecodeRuneInString(x[start:])
			pos = start + n
			continue
		}
		out = append(out, [2]int{start, end})
		pos = end
	}
	return out
}

type splitBehavior string

// splitByMatches cuts x by the match ranges with a Hugging Face SplitDelimiterBehavior.
func splitByMatches(x string, ms [][2]int, behavior splitBehavior, invert bool) []string {
	type span struct {
		s, e  int
		match bool
	}
	var spans []span
	prev := 0
	for _, m := range ms {
		if m[0] > prev {
			spans = append(spans, span{prev, m[0], false})
		}
		spans = append(spans, span{m[0], m[1], true})
		prev = m[1]
	}
	if prev < len(x) {
		spans = append(spans, span{prev, len(x), false})
	}
	if invert {
		for i := range spans {
			spans[i].match = !spans[i].match
		}
	}
	var out []string
	switch behavior {
	case "Removed":
		for _, sp := range spans {
			if !sp.match {
				out = append(out, x[sp.s:sp.e])
			}
		}
	case "MergedWithPrevious":
		for _, sp := range spans {
			if sp.match && len(out) > 0 {
				out[len(out)-1] += x[sp.s:sp.e]
			} else {
				out = append(out, x[sp.s:sp.e])
			}
		}
	case "MergedWithNext":
		pending := ""
		for _, sp := range spans {
			if sp.match {
				pending += x[sp.s:sp.e]
				continue
			}
			out = append(out, pending+x[sp.s:sp.e])
			pending = ""
		}
		if pending != "" {
			out = append(out, pending)
		}
	case "Contiguous":
		for i, sp := range spans {
			if sp.match && i > 0 && spans[i-1].match {
				out[len(out)-1] += x[sp.s:sp.e]
			} else {
				out = append(out, x[sp.s:sp.e])
			}
		}
	default: // Isolated
		for _, sp := range spans {
			out = append(out, x[sp.s:sp.e])
		}
	}
	return out
}

type regexSplit struct {
	sp       *splitter
	behavior splitBehavior
	invert   bool
}

func (r regexSplit) split(pieces []string) []string {
	var out []string
	for _, p := range pieces {
		out = append(out, splitByMatches(p, r.sp.matches(p), r.behavior, r.invert)...)
	}
	return out
}

type stringSplit struct {
	delim    string
	behavior splitBehavior
	invert   bool
}

func (s stringSplit) split(pieces []string) []string {
	var out []string
	for _, p := range pieces {
		var ms [][2]int
		for i := 0; s.delim != "" && i <= len(p)-len(s.delim); {
			j := strings.Index(p[i:], s.delim)
			if j < 0 {
				break
			}
			ms = append(ms, [2]int{i + j, i + j + len(s.delim)})
			i += j + len(s.delim)
		}
		out = append(out, splitByMatches(p, ms, s.behavior, s.invert)...)
	}
	return out
}

// byteLevel maps every byte to its GPT-2 byte-level character, after the optional prefix space and GPT-2 split.
type byteLevel struct {
	prefixSpace bool
	re          *splitter
}

func (b byteLevel) split(pieces []string) []string {
	var out []string
	for i, p := range pieces {
		if b.prefixSpace && i == 0 && !strings.HasPrefix(p, " ") {
			p = " " + p
		}
		parts := []string{p}
		if b.re != nil {
			parts = splitByMatches(p, b.re.matches(p), "Isolated", false)
		}
		for _, q := range parts {
			out = append(out, toByteLevel(q))
		}
	}
	return out
}

type metaspace struct {
	replacement string
	prepend     string // always, first, never
	splitOn     bool
}

func (m metaspace) split(pieces []string) []string {
	var out []string
	for i, p := range pieces {
		p = strings.ReplaceAll(p, " ", m.replacement)
		if (m.prepend == "always" || (m.prepend == "first" && i == 0)) && !strings.HasPrefix(p, m.replacement) {
			p = m.replacement + p
		}
		if !m.splitOn {
			out = append(out, p)
			continue
		}
		out = append(out, stringSplit{delim: m.replacement, behavior: "MergedWithNext"}.split([]string{p})...)
	}
	return out
}

type funcSplit func(string) []string

func (f funcSplit) split(pieces []string) []string {
	var out []string
	for _, p := range pieces {
		out = append(out, f(p)...)
	}
	return out
}

func isBertPunct(r rune) bool {
	return (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126) || unicode.IsPunct(r)
}

// bertSplit splits on whitespace (dropped) and isolates punctuation, as BertPreTokenizer.
func bertSplit(x string) []string {
	var out []string
	start := -1
	for i, r := range x {
		switch {
		case unicode.IsSpace(r):
			if start >= 0 {
				out = append(out, x[start:i])
				start = -1
			}
		case isBertPunct(r):
			if start >= 0 {
				out = append(out, x[start:i])
				start = -1
			}
			out = append(out, string(r))
		default:
			if start < 0 {
				start = i
			}
		}
	}
	if start >= 0 {
		out = append(out, x[start:])
	}
	return out
}

var wordRE = regexp.MustCompile(`\w+|[^\w\s]+`)

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	typ, err := typeOf(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var s struct {
			Pre []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		var seq preSeq
		for _, r := range s.Pre {
			p, err := parsePreTokenizer(r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, p)
		}
		return seq, nil
	case "Split":
		var s struct {
			Pattern  pattern       `json:"pattern"`
			Behavior splitBehavior `json:"behavior"`
			Invert   bool          `json:"invert"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		if s.Pattern.String != nil {
			return stringSplit{*s.Pattern.String, s.Behavior, s.Invert}, nil
		}
		if s.Pattern.Regex == nil {
			return nil, fmt.Errorf("Split has no pattern")
		}
		sp, err := newSplitter(*s.Pattern.Regex)
		if err != nil {
			return nil, err
		}
		return regexSplit{sp, s.Behavior, s.Invert}, nil
	case "ByteLevel":
		var b struct {
			PrefixSpace bool  `json:"add_prefix_space"`
			UseRegex    *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, err
		}
		bl := byteLevel{prefixSpace: b.PrefixSpace}
		if b.UseRegex == nil || *b.UseRegex {
			if bl.re, err = newSplitter(gpt2Pattern); err != nil {
				return nil, err
			}
		}
		return bl, nil
	case "Metaspace":
		var m struct {
			Replacement   string `json:"replacement"`
			PrependScheme string `json:"prepend_scheme"`
			AddPrefix     *bool  `json:"add_prefix_space"`
			Split         *bool  `json:"split"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
		ms := metaspace{replacement: m.Replacement, prepend: m.PrependScheme, splitOn: m.Split == nil || *m.Split}
		if ms.replacement == "" {
			ms.replacement = "▁"
		}
		if ms.prepend == "" {
			ms.prepend = "always"
			if m.AddPrefix != nil && !*m.AddPrefix {
				ms.prepend = "never"
			}
		}
		return ms, nil
	case "BertPreTokenizer":
		return funcSplit(bertSplit), nil
	case "Whitespace":
		return funcSplit(func(x string) []string { return wordRE.FindAllString(x, -1) }), nil
	case "WhitespaceSplit":
		return funcSplit(strings.Fields), nil
	case "Punctuation":
		var p struct {
			Behavior splitBehavior `json:"behavior"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		if p.Behavior == "" {
			p.Behavior = "Isolated"
		}
		return funcSplit(func(x string) []string {
			var ms [][2]int
			for i, r := range x {
				if isBertPunct(r) {
					ms = append(ms, [2]int{i, i + utf8.RuneLen(r)})
				}
			}
			return splitByMatches(x, ms, p.Behavior, false)
		}), nil
	case "Digits":
		var d struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return nil, err
		}
		return funcSplit(func(x string) []string {
			var ms [][2]int
			for i, r := range x {
				if unicode.IsDigit(r) {
					if !d.Individual && len(ms) > 0 && ms[len(ms)-1][1] == i {
						ms[len(ms)-1][1] = i + utf8.RuneLen(r)
					} else {
						ms = append(ms, [2]int{i, i + utf8.RuneLen(r)})
					}
				}
			}
			return splitByMatches(x, ms, "Isolated", false)
		}), nil
	}
	return nil, fmt.Errorf("unsupported pre_tokenizer type %q", typ)
}

// byteRunes is GPT-2's byte-to-character table: printable bytes map to themselves, the others to U+0100 on.
var byteRunes, runeBytes = func() ([256]rune, map[rune]byte) {
	var t [256]rune
	back := map[rune]byte{}
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
		back[t[b]] = byte(b)
	}
	return t, back
}()

func toByteLevel(s string) string {
	var sb strings.Builder
	sb.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteRunes[s[i]])
	}
	return sb.String()
}
