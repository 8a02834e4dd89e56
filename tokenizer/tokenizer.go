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
	BOSToken     string `json:"-"`
	EOSToken     string `json:"-"`
	PadToken     string `json:"-"`
	ChatTemplate string `json:"-"`
	AddBOS       *bool  `json:"-"`
	AddEOS       *bool  `json:"-"`
	MaxLength    int    `json:"-"`
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
	if v, ok := raw["chat_template"]; ok {
		var s string
		if json.Unmarshal(v, &s) == nil {
			t.Config.ChatTemplate = s
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
		ids = t.post.single(ids)
	}
	return ids
}

// EncodePair returns the ids of a pair of texts (sentence-pair tasks), joined by the post-processor's pair
// template when addSpecial (simply concatenated otherwise).
func (t *Tokenizer) EncodePair(a, b string, addSpecial bool) []int {
	x, y := t.encodeText(a), t.encodeText(b)
	if addSpecial && t.post != nil {
		return t.post.pair(x, y)
	}
	return append(x, y...)
}

func (t *Tokenizer) encodeText(text string) []int {
	var ids []int
	for _, seg := range t.added.split(text) {
		if seg.id >= 0 {
			ids = append(ids, seg.id)
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
			}
		}
	}
	return ids
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
