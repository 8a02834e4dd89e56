package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// source is what a tokenizer keeps of the file it was read from, for GGUFVocab: a tokenizer.json's
// pre-tokenizer and added tokens, or a SentencePiece model's pieces and settings.
type source struct {
	pre         json.RawMessage
	added       []addedToken
	sp          []spPiece
	spModelType int
	addDummy    bool
}

// GGUF token types (tokenizer.ggml.token_type, llama.cpp's llama_token_type).
const (
	GGUFNormal      = 1
	GGUFUnknown     = 2
	GGUFControl     = 3
	GGUFUserDefined = 4
	GGUFUnused      = 5
	GGUFByte        = 6
)

// GGUF tokenizer models (tokenizer.ggml.model) memfit writes and reads.
const (
	GGUFByteLevelBPE   = "gpt2"  // byte-level BPE: GPT-2, Llama-3, Qwen2
	GGUFSentencePiece  = "llama" // SentencePiece BPE with byte fallback: Llama-2, Mistral
	GGUFNoVocab        = "none"  // no tokenizer (token ids only)
	ggufPreLlama3      = "llama-bpe"
	ggufPreGPT2        = "gpt-2"
	ggufPreQwen2       = "qwen2"
	ggufPreDefault     = "default"
	regexLlama3        = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	regexQwen2         = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	spaceMark          = "▁"
	ggufPaddingPattern = "[PAD%d]"
)

// GGUFVocab is a tokenizer as GGUF's tokenizer.* metadata holds it (llama.cpp's vocabulary).
type GGUFVocab struct {
	// Model is tokenizer.ggml.model: GGUFByteLevelBPE or GGUFSentencePiece.
	Model string
	// Pre is tokenizer.ggml.pre, the name llama.cpp gives the pre-tokenizer of a byte-level BPE ("llama-bpe",
	// "gpt-2", "qwen2"); "default" for SentencePiece.
	Pre string
	// Tokens, Types and (SentencePiece) Scores are per id; Merges ("a b", in rank order) for byte-level BPE.
	Tokens []string
	Types  []int32
	Scores []float32
	Merges []string
	// BOS, EOS, UNK and Pad are token ids, -1 when absent.
	BOS, EOS, UNK, Pad int
	// AddBOS and AddEOS say whether encoding adds BOS / EOS; AddSpacePrefix whether SentencePiece puts a space
	// before the text.
	AddBOS, AddEOS, AddSpacePrefix bool
	// ChatTemplate is tokenizer_config.json's chat_template ("" when none).
	ChatTemplate string
}

// GGUFVocab returns the tokenizer in GGUF's terms for a model of vocabSize tokens (ids past the tokenizer's own
// become unused "[PADn]" tokens, as llama.cpp's converter makes them). Byte-level BPE with the Llama-3, Qwen2
// or GPT-2 pre-tokenizer, and SentencePiece BPE (a tokenizer.model, or a tokenizer.json with byte fallback) are
// supported; other tokenizers are an error naming what is missing.
func (t *Tokenizer) GGUFVocab(vocabSize int) (*GGUFVocab, error) {
	if len(t.idToToken) > vocabSize {
		return nil, fmt.Errorf("the tokenizer has %d tokens but the model's vocabulary has %d", len(t.idToToken), vocabSize)
	}
	v := &GGUFVocab{BOS: t.bos, EOS: t.eos, UNK: t.unk, Pad: t.pad, ChatTemplate: t.Config.ChatTemplate}
	if ids := t.Encode("a", true); len(ids) > 0 {
		v.AddBOS = t.bos >= 0 && ids[0] == t.bos
		v.AddEOS = t.eos >= 0 && ids[len(ids)-1] == t.eos
	}
	v.Tokens = make([]string, vocabSize)
	v.Types = make([]int32, vocabSize)
	copy(v.Tokens, t.idToToken)
	userDefined := map[int]bool{}
	for _, a := range t.src.added {
		if !a.Special {
			userDefined[a.ID] = true
		}
	}
	for i := range v.Tokens {
		switch {
		case i >= len(t.idToToken) || t.idToToken[i] == "":
			v.Tokens[i], v.Types[i] = fmt.Sprintf(ggufPaddingPattern, i), GGUFUnused
		case i == t.unk:
			v.Types[i] = GGUFUnknown
		case t.special[i]:
			v.Types[i] = GGUFControl
		case userDefined[i]:
			v.Types[i] = GGUFUserDefined
		default:
			v.Types[i] = GGUFNormal
		}
	}
	switch m := t.model.(type) {
	case *spBPE:
		v.Model, v.Pre, v.AddSpacePrefix = GGUFSentencePiece, ggufPreDefault, t.src.addDummy
		v.Scores = make([]float32, vocabSize)
		for i, p := range t.src.sp {
			v.Scores[i] = p.score
			v.Types[i] = int32(p.typ)
		}
		return v, nil
	case *bpe:
		merges := make([]pair, len(m.merges))
		for p, mg := range m.merges {
			if mg.rank < len(merges) {
				merges[mg.rank] = p
			}
		}
		if m.byteFallback {
			// A SentencePiece BPE converted to tokenizer.json: llama.cpp merges the pair whose joined piece has the
			// highest score; the score -rank of the merge that makes each piece gives the merges' order.
			v.Model, v.Pre = GGUFSentencePiece, ggufPreDefault
			v.Scores = make([]float32, vocabSize)
			for i := range v.Scores {
				v.Scores[i] = -float32(len(merges) + i)
			}
			for _, mg := range m.merges {
				v.Scores[mg.id] = max(v.Scores[mg.id], -float32(mg.rank))
			}
			for i, tok := range v.Tokens {
				if v.Types[i] == GGUFNormal && len(tok) == 6 && strings.HasPrefix(tok, "<0x") && strings.HasSuffix(tok, ">") {
					v.Types[i] = GGUFByte
				}
			}
			first := t.Encode("x", false)
			v.AddSpacePrefix = len(first) > 0 && strings.HasPrefix(t.idToToken[first[0]], spaceMark)
			return v, nil
		}
		pre, err := ggufPre(t.src.pre)
		if err != nil {
			return nil, err
		}
		v.Model, v.Pre = GGUFByteLevelBPE, pre
		v.Merges = make([]string, 0, len(merges))
		for _, p := range merges {
			v.Merges = append(v.Merges, t.idToToken[p.a]+" "+t.idToToken[p.b])
		}
		return v, nil
	}
	return nil, fmt.Errorf("GGUF export supports byte-level BPE (Llama-3, GPT-2 style) and SentencePiece BPE (Llama-2, Mistral) tokenizers; %s is neither", t.describe())
}

// describe names the tokenizer's model kind for messages.
func (t *Tokenizer) describe() string {
	switch t.model.(type) {
	case *wordPiece:
		return "this WordPiece tokenizer"
	case *unigram:
		return "this Unigram tokenizer"
	}
	return "this tokenizer"
}

// ggufPre returns llama.cpp's name for a byte-level BPE pre-tokenizer (tokenizer.json's pre_tokenizer): the
// Llama-3 or Qwen2 split regex before ByteLevel, or ByteLevel with GPT-2's own regex.
func ggufPre(raw json.RawMessage) (string, error) {
	var regexes []string
	byteLevel, gpt2Regex := false, false
	var walk func(raw json.RawMessage) error
	walk = func(raw json.RawMessage) error {
		var c struct {
			Type     string            `json:"type"`
			Pre      []json.RawMessage `json:"pretokenizers"`
			Pattern  pattern           `json:"pattern"`
			UseRegex *bool             `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return err
		}
		switch c.Type {
		case "Sequence":
			for _, r := range c.Pre {
				if err := walk(r); err != nil {
					return err
				}
			}
		case "Split":
			if c.Pattern.Regex != nil {
				regexes = append(regexes, *c.Pattern.Regex)
			}
		case "ByteLevel":
			byteLevel = true
			gpt2Regex = c.UseRegex == nil || *c.UseRegex
		}
		return nil
	}
	if !isNull(raw) {
		if err := walk(raw); err != nil {
			return "", fmt.Errorf("pre_tokenizer: %w", err)
		}
	}
	switch {
	case !byteLevel:
		return "", fmt.Errorf("GGUF export supports byte-level BPE and SentencePiece BPE tokenizers; this BPE tokenizer has neither a ByteLevel pre-tokenizer nor byte fallback")
	case len(regexes) == 0 && gpt2Regex:
		return ggufPreGPT2, nil
	case len(regexes) == 1 && !gpt2Regex && regexes[0] == regexLlama3:
		return ggufPreLlama3, nil
	case len(regexes) == 1 && !gpt2Regex && regexes[0] == regexQwen2:
		return ggufPreQwen2, nil
	}
	return "", fmt.Errorf("the byte-level pre-tokenizer (split %q) is not one whose llama.cpp name memfit knows (Llama-3's llama-bpe, Qwen2's, GPT-2's): llama.cpp would split the text differently", regexes)
}

// FromGGUFVocab builds a tokenizer from GGUF's tokenizer metadata (GGUFVocab's inverse): encodings equal those
// of the tokenizer the vocabulary was taken from.
func FromGGUFVocab(v *GGUFVocab) (*Tokenizer, error) {
	n := len(v.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("the GGUF vocabulary has no tokens")
	}
	if len(v.Types) != 0 && len(v.Types) != n {
		return nil, fmt.Errorf("tokenizer.ggml.token_type has %d entries for %d tokens", len(v.Types), n)
	}
	typ := func(i int) int32 {
		if len(v.Types) == 0 {
			return GGUFNormal
		}
		return v.Types[i]
	}
	for _, id := range []int{v.BOS, v.EOS, v.UNK, v.Pad} {
		if id >= n {
			return nil, fmt.Errorf("special token id %d is outside the vocabulary of %d tokens", id, n)
		}
	}
	var t *Tokenizer
	switch v.Model {
	case GGUFSentencePiece:
		if len(v.Scores) != n {
			return nil, fmt.Errorf("tokenizer.ggml.scores has %d entries for %d tokens", len(v.Scores), n)
		}
		pieces := make([]spPiece, n)
		byteFallback := false
		for i := range pieces {
			pieces[i] = spPiece{piece: v.Tokens[i], score: v.Scores[i], typ: int(typ(i))}
			if pieces[i].typ < GGUFNormal || pieces[i].typ > GGUFByte {
				pieces[i].typ = GGUFNormal
			}
			byteFallback = byteFallback || pieces[i].typ == GGUFByte
		}
		var err error
		if t, err = newSentencePiece(pieces, 2, byteFallback, v.AddSpacePrefix, false, v.BOS, v.EOS, v.UNK, v.Pad); err != nil {
			return nil, err
		}
		// Control and user-defined tokens written in the text are those tokens, as llama.cpp (parsing special
		// tokens) and Hugging Face's fast tokenizers take them.
		var added []addedToken
		for i, p := range pieces {
			if p.typ == GGUFControl || p.typ == GGUFUserDefined {
				added = append(added, addedToken{ID: i, Content: p.piece, Special: p.typ == GGUFControl})
			}
		}
		t.added = newAddedVocab(added)
		t.Config.AddBOS, t.Config.AddEOS = &v.AddBOS, &v.AddEOS
		t.spTemplate()
	case GGUFByteLevelBPE:
		j, err := byteLevelJSON(v, typ)
		if err != nil {
			return nil, err
		}
		if t, err = parseTokenizerJSON(j); err != nil {
			return nil, fmt.Errorf("GGUF vocabulary: %w", err)
		}
		for _, p := range []struct {
			id  int
			dst *string
		}{{v.BOS, &t.Config.BOSToken}, {v.EOS, &t.Config.EOSToken}, {v.Pad, &t.Config.PadToken}} {
			if p.id >= 0 {
				*p.dst = v.Tokens[p.id]
			}
		}
		t.Config.AddBOS, t.Config.AddEOS = &v.AddBOS, &v.AddEOS
	default:
		return nil, fmt.Errorf("tokenizer.ggml.model %q is not one memfit reads (%s, %s)", v.Model, GGUFByteLevelBPE, GGUFSentencePiece)
	}
	t.Config.ChatTemplate = v.ChatTemplate
	t.resolveSpecial()
	for _, p := range []struct {
		id  int
		dst *int
	}{{v.BOS, &t.bos}, {v.EOS, &t.eos}, {v.Pad, &t.pad}, {v.UNK, &t.unk}} {
		*p.dst = p.id
	}
	return t, nil
}

// byteLevelJSON writes the tokenizer.json of a byte-level BPE GGUF vocabulary: the BPE model, the
// pre-tokenizer v.Pre names, control and user-defined tokens as added tokens, BOS/EOS added as v says.
func byteLevelJSON(v *GGUFVocab, typ func(int) int32) ([]byte, error) {
	var pre any
	switch v.Pre {
	case ggufPreLlama3, ggufPreQwen2:
		re := regexLlama3
		if v.Pre == ggufPreQwen2 {
			re = regexQwen2
		}
		pre = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": re}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}}
	case ggufPreGPT2:
		pre = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
	default:
		return nil, fmt.Errorf("tokenizer.ggml.pre %q is not a pre-tokenizer memfit rebuilds (%s, %s, %s)", v.Pre, ggufPreLlama3, ggufPreQwen2, ggufPreGPT2)
	}
	vocab := make(map[string]int, len(v.Tokens))
	var added []map[string]any
	for i, tok := range v.Tokens {
		switch typ(i) {
		case GGUFControl, GGUFUserDefined:
			added = append(added, map[string]any{"id": i, "content": tok, "special": typ(i) == GGUFControl,
				"single_word": false, "lstrip": false, "rstrip": false, "normalized": typ(i) != GGUFControl})
		case GGUFUnused:
			continue
		}
		if _, dup := vocab[tok]; !dup {
			vocab[tok] = i
		}
	}
	var post any
	var single []any
	special := map[string]any{}
	if v.AddBOS && v.BOS >= 0 {
		single = append(single, map[string]any{"SpecialToken": map[string]any{"id": v.Tokens[v.BOS], "type_id": 0}})
		special[v.Tokens[v.BOS]] = map[string]any{"id": v.Tokens[v.BOS], "ids": []int{v.BOS}, "tokens": []string{v.Tokens[v.BOS]}}
	}
	single = append(single, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}})
	if v.AddEOS && v.EOS >= 0 {
		single = append(single, map[string]any{"SpecialToken": map[string]any{"id": v.Tokens[v.EOS], "type_id": 0}})
		special[v.Tokens[v.EOS]] = map[string]any{"id": v.Tokens[v.EOS], "ids": []int{v.EOS}, "tokens": []string{v.Tokens[v.EOS]}}
	}
	if len(single) > 1 {
		pair := append(slices.Clone(single), single...)
		post = map[string]any{"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}
	}
	return json.Marshal(map[string]any{
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  pre,
		"post_processor": post,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": v.Merges,
			// llama.cpp takes a word found whole in the vocabulary as it is for Llama-3 (as its tokenizer.json says).
			"ignore_merges": v.Pre == ggufPreLlama3},
	})
}
