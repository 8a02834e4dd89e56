// Package bpetrain trains a byte-level BPE tokenizer on text and writes it as a Hugging Face tokenizer.json, so any
// HF-compatible reader (memfit's tokenizer package, Hugging Face tokenizers) loads it, in one of two layouts: the
// Llama-3 one (the Llama-3 split regex, byte-level alphabet, merges, a BOS template, special tokens after the
// vocabulary) or RoBERTa's (GPT-2's split regex inside the ByteLevel pre-tokenizer, <s> <pad> </s> <unk> <mask>
// as ids 0-4 before the byte alphabet, RobertaProcessing's <s> A </s></s> B </s>), which is what Hugging Face's
// ByteLevelBPETokenizer trainer writes for a new RoBERTa.
//
// The algorithm is the classic one (Sennrich et al. 2016, byte-level as GPT-2): split the text into chunks with
// the pre-tokenizer, count the chunks, start from the 256 byte symbols and repeatedly merge the most frequent
// adjacent pair (ties broken by the smaller pair of symbol strings, so training is deterministic) until the
// vocabulary has the requested size.
package bpetrain

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// SplitPattern is the Llama-3 pre-tokenizer regex, written into tokenizer.json. Go's regexp has no lookahead, so
// Split reproduces its `\s+(?!\S)` branch by hand.
const SplitPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

var splitRE = regexp.MustCompile(`^(?:(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+)`)

// Split cuts text into the Llama-3 pre-tokenizer's chunks.
func Split(text string) []string { return splitWith(text, splitRE, isSpaceRun) }

// gpt2RE is GPT-2's split regex (ByteLevel's use_regex), anchored, without its `\s+(?!\S)` lookahead, which
// SplitGPT2 reproduces by hand as Split does.
var gpt2RE = regexp.MustCompile(`^(?:'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+)`)

// SplitGPT2 cuts text into the chunks of GPT-2's pre-tokenizer (RoBERTa's ByteLevel pre-tokenizer).
func SplitGPT2(text string) []string { return splitWith(text, gpt2RE, isWhitespace) }

// splitWith cuts text into the matches of the anchored regex re, one at a time from the left, and reproduces the
// patterns' `\s+(?!\S)` branch, which Go's regexp cannot express: a whitespace run (as lookahead tells it: any
// whitespace for GPT-2's pattern, one without a newline for Llama-3's, whose newline runs an earlier branch takes)
// followed by a non-space leaves its last character to the next chunk, which then starts with it (" word").
func splitWith(text string, re *regexp.Regexp, lookahead func(string) bool) []string {
	var out []string
	for i := 0; i < len(text); {
		n := 0
		if loc := re.FindStringIndex(text[i:]); loc != nil {
			n = loc[1]
		}
		if n == 0 { // invalid UTF-8 or a character no branch takes: one rune on its own
			_, n = utf8.DecodeRuneInString(text[i:])
		}
		chunk := text[i : i+n]
		if i+n < len(text) && lookahead(chunk) {
			if r, _ := utf8.DecodeRuneInString(text[i+n:]); !unicode.IsSpace(r) {
				if _, last := utf8.DecodeLastRuneInString(chunk); last < len(chunk) {
					chunk = chunk[:len(chunk)-last]
					n = len(chunk)
				}
			}
		}
		out = append(out, chunk)
		i += n
	}
	return out
}

func isWhitespace(s string) bool {
	for _, r := range s {
		if !unicode.IsSpace(r) {
			return false
		}
	}
	return s != ""
}

func isSpaceRun(s string) bool {
	for _, r := range s {
		if !unicode.IsSpace(r) || r == '\n' || r == '\r' {
			return false
		}
	}
	return s != ""
}

// byteRunes is GPT-2's byte-to-unicode table: printable bytes map to themselves, the others to 256+i.
var byteRunes = func() [256]rune {
	var t [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}()

// ByteLevel returns s with each byte replaced by its byte-level character.
func ByteLevel(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteRunes[s[i]])
	}
	return sb.String()
}

// Layouts of the tokenizer.json Train's model is written in.
const (
	// LayoutLlama3 is the Llama-3 layout (the default): special tokens after the vocabulary, a BOS template.
	LayoutLlama3 = "llama3"
	// LayoutRoBERTa is RoBERTa's: RobertaSpecial as ids 0-4, GPT-2's split, RobertaProcessing.
	LayoutRoBERTa = "roberta"
)

// RobertaSpecial are the special tokens of the RoBERTa layout, ids 0 to 4: BOS/CLS, padding, EOS/SEP, unknown and
// the masked-LM mask.
var RobertaSpecial = []string{"<s>", "<pad>", "</s>", "<unk>", "<mask>"}

// Options configure Train.
type Options struct {
	// Layout is LayoutLlama3 ("" too) or LayoutRoBERTa. The RoBERTa layout has its own special tokens
	// (RobertaSpecial): Special must be empty.
	Layout string
	// VocabSize is the final vocabulary size, special tokens included (at least 256 + len(Special)).
	VocabSize int
	// Special are the special tokens, appended after the learned vocabulary; the first is the BOS token that the
	// post-processor adds (none when empty), the second the EOS token.
	Special []string
	// MinFrequency stops merging when the best pair occurs fewer times (default 2).
	MinFrequency int
}

// Model is a trained tokenizer.
type Model struct {
	// Vocab lists the tokens by id (byte-level strings; special tokens verbatim).
	Vocab []string
	// Merges are the learned merges, in order.
	Merges [][2]string
	// Special are the special tokens (their ids follow the learned vocabulary; in the RoBERTa layout they come
	// first, ids 0 to 4).
	Special []string
	// Layout is the tokenizer.json layout (Options.Layout).
	Layout string
}

// specialFirst reports whether the special tokens take the first ids (RoBERTa layout).
func (m *Model) specialFirst() bool { return m.Layout == LayoutRoBERTa }

// specialID returns the id of special token i.
func (m *Model) specialID(i int) int {
	if m.specialFirst() {
		return i
	}
	return len(m.Vocab) - len(m.Special) + i
}

// learned returns the byte and merged tokens (the vocabulary without the special tokens) and the id of the first.
func (m *Model) learned() ([]string, int) {
	if m.specialFirst() {
		return m.Vocab[len(m.Special):], len(m.Special)
	}
	return m.Vocab[:len(m.Vocab)-len(m.Special)], 0
}

type word struct {
	syms []int
	freq int
}

// Train learns a BPE vocabulary from texts.
func Train(texts []string, opts Options) (*Model, error) {
	if opts.MinFrequency == 0 {
		opts.MinFrequency = 2
	}
	split := Split
	switch opts.Layout {
	case "", LayoutLlama3:
		opts.Layout = LayoutLlama3
	case LayoutRoBERTa:
		if len(opts.Special) > 0 {
			return nil, fmt.Errorf("the RoBERTa layout has its own special tokens (%s): give no others", strings.Join(RobertaSpecial, " "))
		}
		opts.Special, split = RobertaSpecial, SplitGPT2
	default:
		return nil, fmt.Errorf("unknown tokenizer layout %q: use %s or %s", opts.Layout, LayoutLlama3, LayoutRoBERTa)
	}
	if opts.VocabSize < 256+len(opts.Special) {
		return nil, fmt.Errorf("vocab size %d is below the 256 byte tokens + %d special tokens", opts.VocabSize, len(opts.Special))
	}
	counts := map[string]int{}
	for _, t := range texts {
		for _, c := range split(t) {
			counts[c]++
		}
	}
	m := &Model{Special: opts.Special, Layout: opts.Layout}
	// The byte alphabet, ordered by character as Hugging Face's trainer orders it.
	alphabet := make([]string, 256)
	for b := range alphabet {
		alphabet[b] = string(byteRunes[b])
	}
	sort.Strings(alphabet)
	index := map[string]int{}
	for i, s := range alphabet {
		index[s] = i
	}
	m.Vocab = alphabet
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	words := make([]word, 0, len(keys))
	for _, k := range keys {
		w := word{freq: counts[k]}
		for i := 0; i < len(k); i++ {
			w.syms = append(w.syms, index[string(byteRunes[k[i]])])
		}
		words = append(words, w)
	}
	type pair struct{ a, b int }
	for len(m.Vocab) < opts.VocabSize-len(opts.Special) {
		pairs := map[pair]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[pair{w.syms[i], w.syms[i+1]}] += w.freq
			}
		}
		best, bestN := pair{}, 0
		for p, n := range pairs {
			if n > bestN || n == bestN && less(m.Vocab, p.a, p.b, best.a, best.b) {
				best, bestN = p, n
			}
		}
		if bestN < opts.MinFrequency {
			break
		}
		id := len(m.Vocab)
		m.Vocab = append(m.Vocab, m.Vocab[best.a]+m.Vocab[best.b])
		m.Merges = append(m.Merges, [2]string{m.Vocab[best.a], m.Vocab[best.b]})
		for wi := range words {
			s := words[wi].syms
			out := s[:0]
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == best.a && s[i+1] == best.b {
					out = append(out, id)
					i++
				} else {
					out = append(out, s[i])
				}
			}
			words[wi].syms = out
		}
	}
	if m.specialFirst() {
		m.Vocab = append(append([]string(nil), opts.Special...), m.Vocab...)
	} else {
		m.Vocab = append(m.Vocab, opts.Special...)
	}
	return m, nil
}

func less(vocab []string, a1, b1, a2, b2 int) bool {
	if vocab[a1] != vocab[a2] {
		return vocab[a1] < vocab[a2]
	}
	return vocab[b1] < vocab[b2]
}

// TokenizerJSON returns the model as a Hugging Face tokenizer.json. The Llama-3 layout: the Llama-3 pre-tokenizer
// (split regex, then byte level), the BPE model, a TemplateProcessing post-processor that adds the first special
// token (BOS) in front of every sequence, and the byte-level decoder. The RoBERTa layout: the ByteLevel
// pre-tokenizer with GPT-2's regex, the BPE model whose vocabulary holds the special tokens first,
// RobertaProcessing (<s> A </s>, pairs <s> A </s></s> B </s>), the byte-level decoder.
func (m *Model) TokenizerJSON() ([]byte, error) {
	type obj = map[string]any
	learned, first := m.learned()
	vocab := make(map[string]int, len(m.Vocab))
	for i, s := range learned {
		vocab[s] = first + i
	}
	var added []obj
	for i, s := range m.Special {
		added = append(added, obj{"id": m.specialID(i), "content": s, "single_word": false,
			"lstrip": m.specialFirst() && s == "<mask>", "rstrip": false, "normalized": false, "special": true})
		if m.specialFirst() {
			vocab[s] = m.specialID(i) // the trainer's vocabulary holds its special tokens
		}
	}
	var post any
	pre := obj{"type": "Sequence", "pretokenizers": []obj{
		{"type": "Split", "pattern": obj{"Regex": SplitPattern}, "behavior": "Isolated", "invert": false},
		{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}}}
	switch {
	case m.specialFirst():
		post = obj{"type": "RobertaProcessing", "sep": []any{"</s>", 2}, "cls": []any{"<s>", 0}, "trim_offsets": true, "add_prefix_space": false}
		pre = obj{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	case len(m.Special) > 0:
		bos := m.Special[0]
		bosID := m.specialID(0)
		post = obj{"type": "TemplateProcessing",
			"single": []obj{{"SpecialToken": obj{"id": bos, "type_id": 0}}, {"Sequence": obj{"id": "A", "type_id": 0}}},
			"pair": []obj{{"SpecialToken": obj{"id": bos, "type_id": 0}}, {"Sequence": obj{"id": "A", "type_id": 0}},
				{"SpecialToken": obj{"id": bos, "type_id": 1}}, {"Sequence": obj{"id": "B", "type_id": 1}}},
			"special_tokens": obj{bos: obj{"id": bos, "ids": []int{bosID}, "tokens": []string{bos}}}}
	}
	merges := make([][]string, len(m.Merges))
	for i, p := range m.Merges {
		merges[i] = []string{p[0], p[1]}
	}
	doc := obj{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added, "normalizer": nil,
		"pre_tokenizer":  pre,
		"post_processor": post,
		"decoder":        obj{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": obj{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": !m.specialFirst(),
			"vocab": vocab, "merges": merges},
	}
	return json.MarshalIndent(doc, "", "  ")
}

// TokenizerConfigJSON returns a tokenizer_config.json naming the special tokens and the context length: in the
// Llama-3 layout BOS, EOS, and the third as the padding token when given; in the RoBERTa layout all five, as
// RobertaTokenizer's configuration names them.
func (m *Model) TokenizerConfigJSON(maxLength int) ([]byte, error) {
	cfg := map[string]any{"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": maxLength,
		"clean_up_tokenization_spaces": false}
	names := []string{"bos_token", "eos_token", "pad_token"}
	if m.specialFirst() {
		cfg["tokenizer_class"] = "RobertaTokenizer"
		cfg["add_prefix_space"], cfg["errors"], cfg["trim_offsets"] = false, "replace", true
		cfg["cls_token"], cfg["sep_token"] = "<s>", "</s>"
		names = []string{"bos_token", "pad_token", "eos_token", "unk_token", "mask_token"}
	}
	decoder := map[string]any{}
	for i, s := range m.Special {
		if i < len(names) {
			cfg[names[i]] = s
		}
		decoder[fmt.Sprint(m.specialID(i))] = map[string]any{"content": s, "lstrip": m.specialFirst() && s == "<mask>",
			"normalized": false, "rstrip": false, "single_word": false, "special": true}
	}
	cfg["added_tokens_decoder"] = decoder
	return json.MarshalIndent(cfg, "", "  ")
}
