package tokenizer

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

// ggufTexts are the shared tokenizer test strings: every golden.jsonl text and the llama2.c prompts.
func ggufTexts(t *testing.T) []string {
	dir := filepath.Join(golden.SharedDir(t), "tokenizers")
	var texts []string
	for _, name := range []string{"llama3", "mistral", "bert-base-uncased"} {
		for _, g := range readGolden(t, filepath.Join(dir, name, "golden.jsonl")) {
			texts = append(texts, g.Text)
		}
	}
	src, err := os.ReadFile(filepath.Join(dir, "llama2", "llama2c_test_excerpt.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`char\s*\*\s*prompt\d*\s*=\s*"((?:[^"\\]|\\.)*)";`).FindAllStringSubmatch(string(src), -1) {
		s, err := strconv.Unquote(`"` + m[1] + `"`)
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, s)
	}
	return append(texts, "<|begin_of_text|>Hi<|eot_id|> [INST] x [/INST]", "   ", "日本語のテキスト 🦙🦙", "a\n\n\nb\t\tc")
}

// TestGGUFVocabRoundTrip turns each shared tokenizer (Llama-3 and llama-tiny byte-level BPE, Mistral's
// tokenizer.json and Llama-2's tokenizer.model SentencePiece BPE) into GGUF's vocabulary and back: the rebuilt
// tokenizer encodes and decodes every test string as the original does; the GGUF model and pre-tokenizer names
// are llama.cpp's.
func TestGGUFVocabRoundTrip(t *testing.T) {
	dir := filepath.Join(golden.SharedDir(t), "tokenizers")
	texts := ggufTexts(t)
	for _, c := range []struct {
		name, path, model, pre string
		vocab                  int
	}{
		{"llama3", filepath.Join(dir, "llama3"), GGUFByteLevelBPE, "llama-bpe", 128256},
		{"llama-tiny", filepath.Join("..", "pretrained", "llama-tiny"), GGUFByteLevelBPE, "llama-bpe", 4096},
		{"mistral", filepath.Join(dir, "mistral"), GGUFSentencePiece, "default", 32000},
		{"llama2", filepath.Join(dir, "llama2", "tokenizer.model"), GGUFSentencePiece, "default", 32000},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok, err := Load(c.path)
			if err != nil {
				t.Fatal(err)
			}
			v, err := tok.GGUFVocab(c.vocab)
			if err != nil {
				t.Fatal(err)
			}
			if v.Model != c.model || v.Pre != c.pre || len(v.Tokens) != c.vocab || len(v.Types) != c.vocab {
				t.Fatalf("model %q pre %q, %d tokens %d types", v.Model, v.Pre, len(v.Tokens), len(v.Types))
			}
			back, err := FromGGUFVocab(v)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range texts {
				want, got := tok.Encode(s, true), back.Encode(s, true)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("Encode(%q)\n got %v\nwant %v", s, got, want)
					continue
				}
				if d, w := back.Decode(want, true), tok.Decode(want, true); d != w {
					t.Errorf("Decode(%v) = %q, want %q", want, d, w)
				}
			}
			if b1, _ := tok.BOS(); true {
				if b2, _ := back.BOS(); b1 != b2 {
					t.Errorf("BOS %d, want %d", b2, b1)
				}
			}
			if e1, _ := tok.EOS(); true {
				if e2, _ := back.EOS(); e1 != e2 {
					t.Errorf("EOS %d, want %d", e2, e1)
				}
			}
			if back.Config.ChatTemplate != tok.Config.ChatTemplate {
				t.Errorf("chat template not kept")
			}
		})
	}
	// A SentencePiece vocabulary rebuilt from GGUF takes control tokens written in the text as those tokens, as
	// llama.cpp and Hugging Face's fast Llama tokenizer do.
	mistral, err := Load(filepath.Join(dir, "mistral"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := mistral.GGUFVocab(32000)
	if err != nil {
		t.Fatal(err)
	}
	back, err := FromGGUFVocab(v)
	if err != nil {
		t.Fatal(err)
	}
	const chat = "<s>[INST] Hi [/INST] Hello</s>"
	if got, want := back.Encode(chat, false), mistral.Encode(chat, false); !reflect.DeepEqual(got, want) || got[0] != 1 {
		t.Errorf("Encode(%q) = %v, want %v", chat, got, want)
	}
	bert, err := Load(filepath.Join(dir, "bert-base-uncased"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bert.GGUFVocab(30522); err == nil {
		t.Fatal("a WordPiece tokenizer turned into a GGUF vocabulary")
	}
}
