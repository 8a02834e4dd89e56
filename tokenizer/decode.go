package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns tokens into text pieces (Hugging Face's decode_chain: each decoder maps the token list).
type decoder interface {
	decode(tokens []string) []string
}

type decSeq []decoder

func (s decSeq) decode(t []string) []string {
	for _, d := range s {
		t = d.decode(t)
	}
	return t
}

type decFunc func([]string) []string

func (f decFunc) decode(t []string) []string { return f(t) }

// byteLevelDecode maps byte-level characters back to bytes (invalid UTF-8 becomes U+FFFD).
func byteLevelDecode(tokens []string) []string {
	var buf []byte
	for _, t := range tokens {
		for _, r := range t {
			if b, ok := runeBytes[r]; ok {
				buf = append(buf, b)
			} else {
				buf = utf8.AppendRune(buf, r)
			}
		}
	}
	return []string{strings.ToValidUTF8(string(buf), "\uFFFD")}
}

// byteFallbackDecode turns runs of <0xXX> tokens into the text of their bytes (U+FFFD per byte when invalid).
func byteFallbackDecode(tokens []string) []string {
	var out []string
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			if b, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
				pending = append(pending, byte(b))
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

func parseDecoder(raw json.RawMessage) (decoder, error) {
	typ, err := typeOf(raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var j struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
		var seq decSeq
		for _, r := range j.Decoders {
			d, err := parseDecoder(r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, d)
		}
		return seq, nil
	case "ByteLevel":
		return decFunc(byteLevelDecode), nil
	case "ByteFallback":
		return decFunc(byteFallbackDecode), nil
	case "Fuse":
		return decFunc(func(t []string) []string { return []string{strings.Join(t, "")} }), nil
	case "Replace":
		var j struct {
			Pattern pattern `json:"pattern"`
			Content string  `json:"content"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
		rep, err := replacer(j.Pattern, j.Content)
		if err != nil {
			return nil, err
		}
		return decFunc(func(t []string) []string {
			out := make([]string, len(t))
			for i, s := range t {
				out[i] = rep(s)
			}
			return out
		}), nil
	case "Strip":
		var j struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
		return decFunc(func(t []string) []string {
			out := make([]string, len(t))
			for i, s := range t {
				for k := 0; k < j.Start && strings.HasPrefix(s, j.Content) && j.Content != ""; k++ {
					s = s[len(j.Content):]
				}
				for k := 0; k < j.Stop && strings.HasSuffix(s, j.Content) && j.Content != ""; k++ {
					s = s[:len(s)-len(j.Content)]
				}
				out[i] = s
			}
			return out
		}), nil
	case "Metaspace":
		var j struct {
			Replacement   string `json:"replacement"`
			PrependScheme string `json:"prepend_scheme"`
			AddPrefix     *bool  `json:"add_prefix_space"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
		if j.Replacement == "" {
			j.Replacement = "▁"
		}
		strip := j.PrependScheme != "never" && (j.AddPrefix == nil || *j.AddPrefix || j.PrependScheme != "")
		return decFunc(func(t []string) []string {
			out := make([]string, len(t))
			for i, s := range t {
				s = strings.ReplaceAll(s, j.Replacement, " ")
				if i == 0 && strip {
					s = strings.TrimPrefix(s, " ")
				}
				out[i] = s
			}
			return out
		}), nil
	case "WordPiece":
		var j struct {
			Prefix  *string `json:"prefix"`
			Cleanup *bool   `json:"cleanup"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
		prefix := "##"
		if j.Prefix != nil {
			prefix = *j.Prefix
		}
		cleanup := j.Cleanup == nil || *j.Cleanup
		return decFunc(func(t []string) []string {
			out := make([]string, len(t))
			for i, s := range t {
				if i > 0 {
					if strings.HasPrefix(s, prefix) {
						s = s[len(prefix):]
					} else {
						s = " " + s
					}
				}
				if cleanup {
					s = cleanupSpaces(s)
				}
				out[i] = s
			}
			return out
		}), nil
	}
	return nil, fmt.Errorf("unsupported decoder type %q", typ)
}

// cleanupSpaces removes the spaces before punctuation and in English contractions, as Hugging Face's
// clean_up_tokenization.
func cleanupSpaces(s string) string {
	return strings.NewReplacer(" .", ".", " ?", "?", " !", "!", " ,", ",", " ' ", "'", " n't", "n't", " 'm", "'m",
		" 's", "'s", " 've", "'ve", " 're", "'re").Replace(s)
}
