package tokenizer

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

type normalizer interface{ normalize(string) string }

type normSeq []normalizer

func (s normSeq) normalize(x string) string {
	for _, n := range s {
		x = n.normalize(x)
	}
	return x
}

type normFunc func(string) string

func (f normFunc) normalize(x string) string { return f(x) }

// pattern is tokenizer.json's {"String": ...} or {"Regex": ...}.
type pattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	typ, err := typeOf(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var s struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		var seq normSeq
		for _, r := range s.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, n)
		}
		return seq, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		return normFunc(func(x string) string {
			if x == "" {
				return x
			}
			return p.Prepend + x
		}), nil
	case "Replace":
		var r struct {
			Pattern pattern `json:"pattern"`
			Content string  `json:"content"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, err
		}
		rep, err := replacer(r.Pattern, r.Content)
		if err != nil {
			return nil, err
		}
		return normFunc(rep), nil
	case "NFC":
		return normFunc(norm.NFC.String), nil
	case "NFD":
		return normFunc(norm.NFD.String), nil
	case "NFKC":
		return normFunc(norm.NFKC.String), nil
	case "NFKD":
		return normFunc(norm.NFKD.String), nil
	case "Lowercase":
		return normFunc(strings.ToLower), nil
	case "StripAccents":
		return normFunc(stripAccents), nil
	case "Strip":
		var s struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return normFunc(func(x string) string {
			if s.Left {
				x = strings.TrimLeftFunc(x, unicode.IsSpace)
			}
			if s.Right {
				x = strings.TrimRightFunc(x, unicode.IsSpace)
			}
			return x
		}), nil
	case "BertNormalizer":
		var b struct {
			CleanText    bool  `json:"clean_text"`
			ChineseChars bool  `json:"handle_chinese_chars"`
			StripAccents *bool `json:"strip_accents"`
			Lowercase    bool  `json:"lowercase"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, err
		}
		strip := b.Lowercase
		if b.StripAccents != nil {
			strip = *b.StripAccents
		}
		return normFunc(func(x string) string {
			if b.CleanText {
				x = bertClean(x)
			}
			if b.ChineseChars {
				x = padChinese(x)
			}
			if strip {
				x = stripAccents(norm.NFD.String(x))
			}
			if b.Lowercase {
				x = strings.ToLower(x)
			}
			return x
		}), nil
	}
	return nil, fmt.Errorf("unsupported normalizer type %q", typ)
}

// replacer returns a function replacing every match of p with content.
func replacer(p pattern, content string) (func(string) string, error) {
	switch {
	case p.String != nil:
		old := *p.String
		return func(x string) string { return strings.ReplaceAll(x, old, content) }, nil
	case p.Regex != nil:
		re, err := regexp.Compile(*p.Regex)
		if err != nil {
			return nil, fmt.Errorf("regex %q is not supported by Go's regexp: %w", *p.Regex, err)
		}
		return func(x string) string { return re.ReplaceAllLiteralString(x, content) }, nil
	}
	return nil, fmt.Errorf("pattern has neither String nor Regex")
}

func stripAccents(x string) string {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, x)
}

// bertClean removes NUL, U+FFFD and control characters and turns whitespace into spaces, as BertNormalizer.
func bertClean(x string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == 0 || r == 0xfffd:
			return -1
		case r == '\t' || r == '\n' || r == '\r':
			return ' '
		case unicode.IsControl(r) || unicode.In(r, unicode.Cc, unicode.Cf):
			return -1
		case unicode.IsSpace(r):
			return ' '
		}
		return r
	}, x)
}

func isChinese(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

func padChinese(x string) string {
	var sb strings.Builder
	for _, r := range x {
		if isChinese(r) {
			sb.WriteByte(' ')
			sb.WriteRune(r)
			sb.WriteByte(' ')
		} else {
			sb.WriteRune(r)
		}
	}
	return sb.String()
}
