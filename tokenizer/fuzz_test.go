package tokenizer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/internal/fuzzfile"
)

// Fuzz targets for the tokenizer files a user feeds memfit (tokenizer.json, SentencePiece tokenizer.model): any
// bytes give an error or a tokenizer that encodes and decodes without panicking (CI runs them briefly under a
// memory cap: .ci/run, "fuzz").

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3}, "merges": ["a b"], "unk_token": "<unk>"},
		"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}, "decoder": {"type": "ByteLevel"},
		"added_tokens": [{"id": 3, "content": "<unk>", "special": true}]}`))
	f.Add([]byte(`{"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1, "##b": 2}, "unk_token": "[UNK]"}, "normalizer": {"type": "BertNormalizer"}}`))
	f.Add([]byte(`{"model": {"type": "Unigram", "vocab": [["<unk>", 0], ["a", -1.5]], "unk_id": 0}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		tok, err := Parse(raw)
		if err != nil {
			return
		}
		ids := tok.Encode("ab a\tb é 🙂", true)
		_ = tok.Decode(ids, false)
		_ = tok.EncodePair("a", "b", true)
	})
}

func FuzzSentencePiece(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("..", "..", "shared", "data", "tokenizers", "llama2", "tokenizer.model")); err == nil {
		f.Add(b[:min(len(b), 4096)])
	}
	f.Add([]byte{0x0a, 0x09, 0x0a, 0x03, '<', 'u', '>', 0x15, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		tok, err := Load(fuzzfile.Write("sp/tokenizer.model", raw))
		if err != nil {
			return
		}
		ids := tok.Encode("ab a\tb é 🙂", true)
		_ = tok.Decode(ids, false)
	})
}
