package llamagguf

import (
	"fmt"
	"math"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// PlaceholderVocab is the vocabulary of a model without a tokenizer, so that llama.cpp loads the file and runs
// token ids (its tokenizer "none" cannot be loaded by most llama.cpp tools): a SentencePiece-type vocabulary
// whose ids below 256 are the byte tokens "<0xNN>" (llama.cpp needs them to encode any text) and the others
// placeholder tokens "<memfit_token_N>"; BOS, EOS and pad are the config's ids (placeholders, control tokens);
// nothing is added to what is encoded.
func PlaceholderVocab(cfg decoder.Config) *tokenizer.GGUFVocab {
	v := &tokenizer.GGUFVocab{Model: tokenizer.GGUFSentencePiece, Pre: "default", BOS: cfg.BOSTokenID, EOS: cfg.EOSTokenID, UNK: -1, Pad: cfg.PadTokenID,
		Tokens: make([]string, cfg.VocabSize), Types: make([]int32, cfg.VocabSize), Scores: make([]float32, cfg.VocabSize)}
	for _, id := range []*int{&v.BOS, &v.EOS, &v.Pad} {
		if *id >= cfg.VocabSize {
			*id = -1
		}
	}
	for i := range v.Tokens {
		switch {
		case i == v.BOS || i == v.EOS || i == v.Pad:
			v.Tokens[i], v.Types[i] = fmt.Sprintf(PlaceholderToken, i), tokenizer.GGUFControl
		case i < 256:
			// llama.cpp's SentencePiece tokenizer falls back to byte tokens for any text (and fails without them).
			v.Tokens[i], v.Types[i] = fmt.Sprintf("<0x%02X>", i), tokenizer.GGUFByte
		default:
			v.Tokens[i], v.Types[i] = fmt.Sprintf(PlaceholderToken, i), tokenizer.GGUFUserDefined
		}
	}
	return v
}

// PlaceholderToken is the text of token N in PlaceholderVocab.
const PlaceholderToken = "<memfit_token_%d>"

// vocabMeta returns the tokenizer.* metadata of v.
func vocabMeta(v *tokenizer.GGUFVocab) []gguf.KV {
	meta := []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: v.Model},
		{Key: "tokenizer.ggml.pre", Value: v.Pre},
		{Key: "tokenizer.ggml.tokens", Value: v.Tokens},
	}
	if v.Scores != nil {
		meta = append(meta, gguf.KV{Key: "tokenizer.ggml.scores", Value: v.Scores})
	}
	meta = append(meta, gguf.KV{Key: "tokenizer.ggml.token_type", Value: v.Types})
	if v.Model == tokenizer.GGUFByteLevelBPE {
		meta = append(meta, gguf.KV{Key: "tokenizer.ggml.merges", Value: v.Merges})
	}
	for _, id := range []struct {
		key string
		id  int
	}{{"tokenizer.ggml.bos_token_id", v.BOS}, {"tokenizer.ggml.eos_token_id", v.EOS}, {"tokenizer.ggml.unknown_token_id", v.UNK},
		{"tokenizer.ggml.padding_token_id", v.Pad}} {
		if id.id >= 0 {
			meta = append(meta, gguf.KV{Key: id.key, Value: uint32(id.id)})
		}
	}
	meta = append(meta, gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: v.AddBOS}, gguf.KV{Key: "tokenizer.ggml.add_eos_token", Value: v.AddEOS})
	if v.Model == tokenizer.GGUFSentencePiece {
		meta = append(meta, gguf.KV{Key: "tokenizer.ggml.add_space_prefix", Value: v.AddSpacePrefix})
	}
	if v.ChatTemplate != "" {
		meta = append(meta, gguf.KV{Key: "tokenizer.chat_template", Value: v.ChatTemplate})
	}
	return meta
}

// ReadTokenizer reads only the tokenizer of the GGUF file at path (nil when it has none).
func ReadTokenizer(path string) (*tokenizer.Tokenizer, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := readVocab(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// readVocab rebuilds the tokenizer of the tokenizer.* metadata (nil for "none" or no tokenizer).
func readVocab(f *gguf.File) (*tokenizer.Tokenizer, error) {
	model, ok, err := f.String("tokenizer.ggml.model")
	if err != nil || !ok || model == tokenizer.GGUFNoVocab || model == "no_vocab" {
		return nil, err
	}
	v := &tokenizer.GGUFVocab{Model: model, BOS: -1, EOS: -1, UNK: -1, Pad: -1, AddSpacePrefix: true}
	var errs []error
	get := func(key string, dst any) {
		val, ok := f.Value(key)
		if !ok {
			return
		}
		switch d := dst.(type) {
		case *[]string:
			if x, ok := val.([]string); ok {
				*d = x
				return
			}
		case *[]float32:
			if x, ok := val.([]float32); ok {
				*d = x
				return
			}
		case *[]int32:
			if x, ok := val.([]int32); ok {
				*d = x
				return
			}
		case *string:
			if x, ok := val.(string); ok {
				*d = x
				return
			}
		case *bool:
			if x, ok := val.(bool); ok {
				*d = x
				return
			}
		case *int:
			if n, ok, err := f.Uint(key); err == nil && ok {
				*d = int(min(n, math.MaxInt32))
				return
			}
		}
		errs = append(errs, fmt.Errorf("metadata %s is %T, not what a tokenizer holds there", key, val))
	}
	get("tokenizer.ggml.pre", &v.Pre)
	get("tokenizer.ggml.tokens", &v.Tokens)
	get("tokenizer.ggml.scores", &v.Scores)
	get("tokenizer.ggml.token_type", &v.Types)
	get("tokenizer.ggml.merges", &v.Merges)
	get("tokenizer.ggml.bos_token_id", &v.BOS)
	get("tokenizer.ggml.eos_token_id", &v.EOS)
	get("tokenizer.ggml.unknown_token_id", &v.UNK)
	get("tokenizer.ggml.padding_token_id", &v.Pad)
	get("tokenizer.ggml.add_bos_token", &v.AddBOS)
	get("tokenizer.ggml.add_eos_token", &v.AddEOS)
	get("tokenizer.ggml.add_space_prefix", &v.AddSpacePrefix)
	get("tokenizer.chat_template", &v.ChatTemplate)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	// A special token id outside the vocabulary (some converters write 2^32-1 for none) is absent, as llama.cpp
	// takes it.
	for _, id := range []*int{&v.BOS, &v.EOS, &v.UNK, &v.Pad} {
		if *id >= len(v.Tokens) {
			*id = -1
		}
	}
	t, err := tokenizer.FromGGUFVocab(v)
	if err != nil {
		return nil, fmt.Errorf("the tokenizer.* metadata: %w", err)
	}
	return t, nil
}
