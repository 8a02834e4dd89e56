// Package tokenizer reads Hugging Face tokenizers in pure Go: tokenizer.json (BPE, byte-level as GPT-2/Llama-3 or
// SentencePiece-style with byte fallback as Llama-2/Mistral, WordPiece as BERT, Unigram) with its normalizers,
// pre-tokenizers, post-processors, added tokens and decoders, plus tokenizer_config.json (special tokens, chat
// template), and SentencePiece tokenizer.model files. Encodings equal those of the Hugging Face tokenizers
// library (tested against its reference outputs).
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/memfit/memfit/internal/readfile"
)

// Tokenizer turns text into token ids and back.
type Tokenizer struct {
	normalizer normalizer
	pre        preTokenizer
	model      model
	post       postProcessor
	decoder    decoder
	added      *addedVocab

	vocabSize int
	idToToken []string
	tokenToID map[string]int
	special   map[int]bool

	bos, eos, pad, unk int // -1 when absent
	spBOS, spEOS       int // a SentencePiece model's BOS and EOS ids (0 for tokenizer.json)
	// src keeps what GGUFVocab needs of the file the tokenizer was read from.
	src source
	// Config holds tokenizer_config.json's fields that memfit uses (zero when the file is absent).
	Config Config
	// Path is where the tokenizer was read from.
	Path string
}

// Config is the part of tokenizer_config.json memfit reads.
type Config struct {
	BOSToken string `json:"-"`
	EOSToken string `json:"-"`
	PadToken string `json:"-"`
	// UnkToken, SepToken, ClsToken, MaskToken and AdditionalSpecialTokens are the other special tokens of
	// tokenizer_config.json, which transformers hands a chat template as variables.
	UnkToken, SepToken, ClsToken, MaskToken string   `json:"-"`
	AdditionalSpecialTokens                 []string `json:"-"`
	// ChatTemplate is the model's Jinja chat template: chat_template.jinja beside tokenizer_config.json when
	// there is one (transformers saves it there since v4.47 and prefers it), else tokenizer_config.json's
	// chat_template; of the list-of-named-templates form some configs use, the one named "default" (as
	// transformers' apply_chat_template picks it); "" when the model has none.
	ChatTemplate string `json:"-"`
	// ChatTemplateFrom names where ChatTemplate was read ("chat_template.jinja", "tokenizer_config.json",
	// "tokenizer_config.json (default of N named templates)"); ChatTemplates holds every named template of the
	// list form.
	ChatTemplateFrom string            `json:"-"`
	ChatTemplates    map[string]string `json:"-"`
	// ChatTemplateUnused names a chat template that ChatTemplate takes precedence over and that differs from
	// it (tokenizer_config.json's, when chat_template.jinja is there too), for messages; "" when none.
	ChatTemplateUnused string `json:"-"`
	AddBOS             *bool  `json:"-"`
	AddEOS             *bool  `json:"-"`
	MaxLength          int    `json:"-"`
}

// Load reads a tokenizer from a tokenizer.json file, a SentencePiece tokenizer.model file, or a folder holding
// either (tokenizer.json preferred), plus tokenizer_config.json beside it when present (special tokens, chat
// template, add_bos/eos).
func Load(path string) (*Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer %s does not exist (give a tokenizer.json, a tokenizer.model or a folder with one)", path)
		}
		return nil, err
	}
	dir, file := filepath.Dir(path), path
	if st.IsDir() {
		dir = path
		file = ""
		for _, name := range []string{"tokenizer.json", "tokenizer.model"} {
			if _, err := os.Stat(filepath.Join(path, name)); err == nil {
				file = filepath.Join(path, name)
				break
			}
		}
		if file == "" {
			return nil, fmt.Errorf("folder %s has no tokenizer.json or tokenizer.model", path)
		}
	}
	var t *Tokenizer
	if strings.HasSuffix(file, ".model") {
		t, err = loadSentencePiece(file)
	} else {
		var data []byte
		if data, err = readfile.Read(file, readfile.Tokenizer); err == nil {
			t, err = parseTokenizerJSON(data)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	t.Path = file
	if data, err := readfile.Read(filepath.Join(dir, "tokenizer_config.json"), readfile.Config); err == nil {
		if err := t.readConfig(data); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "tokenizer_config.json"), err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	// chat_template.jinja takes precedence, as in transformers; one that is there but cannot be read (a folder, a
	// device, unreadable) is an error, not a reason to fall back to tokenizer_config.json's without a word.
	if data, err := readfile.Read(filepath.Join(dir, ChatTemplateFile), readfile.Config); err == nil {
		if t.Config.ChatTemplate != "" && t.Config.ChatTemplate != string(data) {
			t.Config.ChatTemplateUnused = "tokenizer_config.json"
		}
		t.Config.ChatTemplate, t.Config.ChatTemplateFrom = string(data), ChatTemplateFile
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("the model's chat template: %w", err)
	}
	if t.spBOS != 0 || t.spEOS != 0 {
		t.spTemplate()
	}
	t.resolveSpecial()
	return t, nil
}

// spTemplate sets a SentencePiece model's post-processor from add_bos_token / add_eos_token (BOS only by
// default, as LlamaTokenizer).
func (t *Tokenizer) spTemplate() {
	addBOS, addEOS := true, false
	if t.Config.AddBOS != nil {
		addBOS = *t.Config.AddBOS
	}
	if t.Config.AddEOS != nil {
		addEOS = *t.Config.AddEOS
	}
	var single, pair []templateItem
	wrap := func(seq string) []templateItem {
		var out []templateItem
		if addBOS && t.spBOS >= 0 {
			out = append(out, templateItem{ids: []int{t.spBOS}})
		}
		out = append(out, templateItem{seq: seq})
		if addEOS && t.spEOS >= 0 {
			out = append(out, templateItem{ids: []int{t.spEOS}})
		}
		return out
	}
	single = wrap("A")
	pair = append(wrap("A"), wrap("B")...)
	t.post = template{singleT: single, pairT: pair}
}

// Parse reads a tokenizer from the bytes of a tokenizer.json file (no tokenizer_config.json).
func Parse(tokenizerJSON []byte) (*Tokenizer, error) {
	t, err := parseTokenizerJSON(tokenizerJSON)
	if err != nil {
		return nil, err
	}
	t.resolveSpecial()
	return t, nil
}

func (t *Tokenizer) readConfig(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	tokenField := func(key string) string {
		v, ok := raw[key]
		if !ok {
			return ""
		}
		var s string
		if json.Unmarshal(v, &s) == nil {
			return s
		}
		var o struct {
			Content string `json:"content"`
		}
		if json.Unmarshal(v, &o) == nil {
			return o.Content
		}
		return ""
	}
	t.Config.BOSToken, t.Config.EOSToken, t.Config.PadToken = tokenField("bos_token"), tokenField("eos_token"), tokenField("pad_token")
	t.Config.UnkToken, t.Config.SepToken = tokenField("unk_token"), tokenField("sep_token")
	t.Config.ClsToken, t.Config.MaskToken = tokenField("cls_token"), tokenField("mask_token")
	if v, ok := raw["additional_special_tokens"]; ok {
		var list []json.RawMessage
		if json.Unmarshal(v, &list) == nil {
			for _, item := range list {
				var s string
				var o struct {
					Content string `json:"content"`
				}
				if json.Unmarshal(item, &s) == nil {
					t.Config.AdditionalSpecialTokens = append(t.Config.AdditionalSpecialTokens, s)
				} else if json.Unmarshal(item, &o) == nil && o.Content != "" {
					t.Config.AdditionalSpecialTokens = append(t.Config.AdditionalSpecialTokens, o.Content)
				}
			}
		}
	}
	if v, ok := raw["chat_template"]; ok {
		if err := t.readChatTemplate(v); err != nil {
			return err
		}
	}
	for key, dst := range map[string]**bool{"add_bos_token": &t.Config.AddBOS, "add_eos_token": &t.Config.AddEOS} {
		if v, ok := raw[key]; ok {
			var b bool
			if json.Unmarshal(v, &b) == nil {
				*dst = &b
			}
		}
	}
	if v, ok := raw["model_max_length"]; ok {
		var f float64
		if json.Unmarshal(v, &f) == nil && f > 0 && f < 1e9 {
			t.Config.MaxLength = int(f)
		}
	}
	return nil
}

// ChatTemplateFile is the file beside tokenizer_config.json in which transformers (since v4.47) saves a
// model's chat template.
const ChatTemplateFile = "chat_template.jinja"

// readChatTemplate reads tokenizer_config.json's chat_template: a string, null, or a list of {"name",
// "template"} objects, of which apply_chat_template takes the one named "default".
func (t *Tokenizer) readChatTemplate(v json.RawMessage) error {
	var s *string
	if json.Unmarshal(v, &s) == nil {
		if s != nil {
			t.Config.ChatTemplate, t.Config.ChatTemplateFrom = *s, "tokenizer_config.json"
		}
		return nil
	}
	var named []struct {
		Name     string  `json:"name"`
		Template *string `json:"template"`
	}
	if err := json.Unmarshal(v, &named); err != nil {
		return errors.New(`chat_template is neither a string nor a list of {"name", "template"} objects`)
	}
	t.Config.ChatTemplates = map[string]string{}
	for _, n := range named {
		if n.Name == "" || n.Template == nil {
			return errors.New(`chat_template: each named template needs a "name" and a "template"`)
		}
		t.Config.ChatTemplates[n.Name] = *n.Template
	}
	if d, ok := t.Config.ChatTemplates["default"]; ok {
		t.Config.ChatTemplate = d
		t.Config.ChatTemplateFrom = fmt.Sprintf(`tokenizer_config.json ("default" of %d named templates)`, len(named))
	}
	return nil
}

// resolveSpecial finds the BOS, EOS, pad and unk ids from the config and well-known token names.
func (t *Tokenizer) resolveSpecial() {
	find := func(names ...string) int {
		for _, n := range names {
			if n == "" {
				continue
			}
			if id, ok := t.tokenToID[n]; ok {
				return id
			}
		}
		return -1
	}
	t.bos = find(t.Config.BOSToken, "<|begin_of_text|>", "<s>", "[CLS]", "<bos>")
	t.eos = find(t.Config.EOSToken, "<|end_of_text|>", "</s>", "[SEP]", "<eos>", "<|endoftext|>")
	t.pad = find(t.Config.PadToken, "<|pad|>", "<pad>", "[PAD]")
	t.unk = find("<unk>", "[UNK]")
	if t.model != nil {
		if u := t.model.unkID(); u >= 0 {
			t.unk = u
		}
	}
}

// Encode returns the ids of text. addSpecial applies the post-processor (BOS/EOS, [CLS]/[SEP] templates); for a
// SentencePiece model file it adds BOS (and EOS) as tokenizer_config.json's add_bos/eos_token say (BOS by
// default).
func (t *Tokenizer) Encode(text string, addSpecial bool) []int {
	ids := t.encodeText(text)
	if addSpecial && t.post != nil {
		out, _ := t.post.process(typed(ids, 0), nil)
		ids = out.ids
	}
	return ids
}

// EncodePair returns the ids of a pair of texts (sentence-pair tasks), joined by the post-processor's pair
// template when addSpecial (simply concatenated otherwise).
func (t *Tokenizer) EncodePair(a, b string, addSpecial bool) []int {
	if !addSpecial {
		return append(t.encodeText(a), t.encodeText(b)...)
	}
	return t.EncodeInputs(a, b, true, 0).IDs
}

// Encoding is what a model's input reads of a text or a text pair: its token ids with the post-processor's special
// tokens, and their token type ids (segment ids: 0 for the first text, 1 for the second, or as the template gives
// them), as Hugging Face tokenizers' Encoding has them.
type Encoding struct {
	IDs, TypeIDs []int
}

// EncodeInputs encodes text a, or the pair (a, b) when pair, with the post-processor's special tokens and token
// type ids, cut to maxLength tokens (0: no limit) as Hugging Face tokenizers truncate (truncation=True, the
// longest_first strategy): tokens are dropped from the end of the texts, never the special tokens, the longer
// text first. A maxLength too short to hold the special tokens is honoured as far as it can be (the texts are
// emptied).
func (t *Tokenizer) EncodeInputs(a, b string, pair bool, maxLength int) Encoding {
	xi, xEnds := t.encodePieces(a)
	x := typed(xi, 0)
	var y *seq
	var yEnds []int
	if pair {
		var yi []int
		yi, yEnds = t.encodePieces(b)
		s := typed(yi, 1)
		y = &s
	}
	if maxLength > 0 {
		added := 0
		if t.post != nil {
			added = t.post.added(pair)
		}
		budget := max(maxLength-added, 0)
		if y == nil {
			x.ids, x.types = x.ids[:min(len(x.ids), budget)], x.types[:min(len(x.types), budget)]
		} else {
			n1, n2 := TruncatePair(cappedLength(xEnds, maxLength), cappedLength(yEnds, maxLength), budget)
			x, *y = seq{x.ids[:n1], x.types[:n1]}, seq{y.ids[:n2], y.types[:n2]}
		}
	}
	out := x
	if t.post != nil {
		var rest *seq
		if out, rest = t.post.process(x, y); rest != nil {
			out = out.concat(*rest)
		}
	} else if y != nil {
		out = x.concat(*y)
	}
	return Encoding{IDs: out.ids, TypeIDs: out.types}
}

// TruncatePair returns the lengths two texts of n1 and n2 tokens keep when their total must fit budget (the
// maximum length less the special tokens the pair template adds), as Hugging Face tokenizers' longest_first
// truncation gives them (checked against tokenizers 0.23): the shorter keeps all it has when the longer can take
// the rest, else both get half the budget, the longer (the second on a tie) the odd token. (Hugging Face
// tokenizers compares lengths it has already cut at the first pre-tokenized word that reaches the maximum length;
// EncodeInputs passes those.)
func TruncatePair(n1, n2, budget int) (int, int) {
	budget = max(budget, 0)
	a, b := n1, n2
	if a+b <= budget {
		return a, b
	}
	swap := a > b
	if swap {
		a, b = b, a
	}
	if a > budget {
		b = a
	} else {
		b = max(a, budget-a)
	}
	if a+b > budget {
		a = budget / 2
		b = a + budget%2
	}
	if swap {
		a, b = b, a
	}
	return min(a, n1), min(b, n2)
}

func (t *Tokenizer) encodeText(text string) []int {
	ids, _ := t.encodePieces(text)
	return ids
}

// encodePieces returns the ids of text and, per pre-tokenized piece (or added token), the number of ids up to its
// end.
func (t *Tokenizer) encodePieces(text string) (ids, ends []int) {
	for _, seg := range t.added.split(text) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
			ends = append(ends, len(ids))
			continue
		}
		s := seg.text
		if t.normalizer != nil {
			s = t.normalizer.normalize(s)
		}
		if s == "" {
			continue
		}
		pieces := []string{s}
		if t.pre != nil {
			pieces = t.pre.split(pieces)
		}
		for _, p := range pieces {
			if p != "" {
				ids = t.model.tokenize(p, ids)
				ends = append(ends, len(ids))
			}
		}
	}
	return ids, ends
}

// cappedLength is the number of ids Hugging Face tokenizers holds of a text encoded with truncation to maxLength
// before it truncates the pair: it stops at the first piece that reaches maxLength ids.
func cappedLength(ends []int, maxLength int) int {
	for _, e := range ends {
		if e >= maxLength {
			return e
		}
	}
	if len(ends) == 0 {
		return 0
	}
	return ends[len(ends)-1]
}

// Decode returns the text of ids; skipSpecial drops special tokens (BOS, EOS, padding, ...).
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id >= len(t.idToToken) {
			continue
		}
		if skipSpecial && t.special[id] {
			continue
		}
		tokens = append(tokens, t.idToToken[id])
	}
	if t.decoder == nil {
		return strings.Join(tokens, "")
	}
	return strings.Join(t.decoder.decode(tokens), "")
}

// TokenID returns the id of a token (a vocabulary entry or an added token, as written in the vocabulary).
func (t *Tokenizer) TokenID(token string) (int, bool) {
	id, ok := t.tokenToID[token]
	return id, ok
}

// Token returns the vocabulary entry of id.
func (t *Tokenizer) Token(id int) (string, bool) {
	if id < 0 || id >= len(t.idToToken) {
		return "", false
	}
	return t.idToToken[id], true
}

// VocabSize returns the number of ids (the vocabulary and the added tokens).
func (t *Tokenizer) VocabSize() int { return len(t.idToToken) }

// IsSpecial reports whether id is a special token.
func (t *Tokenizer) IsSpecial(id int) bool { return t.special[id] }

// BOS returns the beginning-of-sequence token's id.
func (t *Tokenizer) BOS() (int, bool) { return t.bos, t.bos >= 0 }

// EOS returns the end-of-sequence token's id.
func (t *Tokenizer) EOS() (int, bool) { return t.eos, t.eos >= 0 }

// Pad returns the padding token's id.
func (t *Tokenizer) Pad() (int, bool) { return t.pad, t.pad >= 0 }

// ModelKind returns the kind of the tokenization model as tokenizer.json names it: "BPE" (byte-level as GPT-2,
// RoBERTa and Llama-3, or SentencePiece-style), "WordPiece" (BERT) or "Unigram" (SentencePiece unigram, as
// XLM-RoBERTa). Families use it to refuse another family's tokenizer by name.
func (t *Tokenizer) ModelKind() string {
	switch t.model.(type) {
	case *wordPiece:
		return "WordPiece"
	case *unigram:
		return "Unigram"
	}
	return "BPE"
}
