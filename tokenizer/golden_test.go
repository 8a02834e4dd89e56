package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

type goldenLine struct {
	Text    string `json:"text"`
	IDs     []int  `json:"ids"`
	Decoded string `json:"decoded"`
}

func readGolden(t *testing.T, path string) []goldenLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []goldenLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var g goldenLine
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, g)
	}
	return out
}

// checkGolden encodes every line's text with special tokens and decodes the ids without them, comparing with
// the reference made by Hugging Face tokenizers.
func checkGolden(t *testing.T, tok *Tokenizer, lines []goldenLine, name string) {
	t.Helper()
	for _, g := range lines {
		if g.IDs == nil {
			g.IDs = []int{}
		}
		got := tok.Encode(g.Text, true)
		if got == nil {
			got = []int{}
		}
		if !reflect.DeepEqual(got, g.IDs) {
			t.Errorf("%s: Encode(%q)\n got %v\nwant %v", name, g.Text, got, g.IDs)
		}
		if dec := tok.Decode(g.IDs, true); dec != g.Decoded {
			t.Errorf("%s: Decode(%v) = %q, want %q", name, g.IDs, dec, g.Decoded)
		}
	}
}

func TestGoldenEncodings(t *testing.T) {
	dir := filepath.Join(golden.SharedDir(t), "tokenizers")
	for _, name := range []string{"llama3", "mistral", "bert-base-uncased"} {
		t.Run(name, func(t *testing.T) {
			tok, err := Load(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tok, readGolden(t, filepath.Join(dir, name, "golden.jsonl")), name)
		})
	}
}

// TestLlama2SentencePiece checks the Llama-2 tokenizer.model against the ids listed in llama2.c's tests.
func TestLlama2SentencePiece(t *testing.T) {
	dir := filepath.Join(golden.SharedDir(t), "tokenizers", "llama2")
	tok, err := Load(filepath.Join(dir, "tokenizer.model"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(dir, "llama2c_test_excerpt.txt"))
	if err != nil {
		t.Fatal(err)
	}
	prompts := regexp.MustCompile(`char\s*\*\s*prompt\d*\s*=\s*"((?:[^"\\]|\\.)*)";`).FindAllStringSubmatch(string(src), -1)
	expected := regexp.MustCompile(`int expected_tokens\d*\[\]\s*=\s*\{([^}]*)\};`).FindAllStringSubmatch(string(src), -1)
	if len(prompts) != 5 || len(expected) != 5 {
		t.Fatalf("found %d prompts and %d expectations in the excerpt", len(prompts), len(expected))
	}
	for i := range prompts {
		text, err := strconv.Unquote(`"` + prompts[i][1] + `"`)
		if err != nil {
			t.Fatal(err)
		}
		var want []int
		for _, f := range strings.Split(expected[i][1], ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, n)
		}
		if got := tok.Encode(text, true); !reflect.DeepEqual(got, want) {
			t.Errorf("Encode(%q)\n got %v\nwant %v", text, got, want)
		}
		if dec := tok.Decode(want, true); dec != text {
			t.Errorf("Decode = %q, want %q", dec, text)
		}
	}
}

// TestEdgeCases compares with references made by Hugging Face tokenizers 0.23.2 on strings chosen for their
// edge cases (whitespace runs, newlines, Unicode, emoji, special-token text, very long words): see
// testdata/make_refs.js.
func TestEdgeCases(t *testing.T) {
	dir := filepath.Join(golden.SharedDir(t), "tokenizers")
	for _, name := range []string{"llama3", "mistral", "bert-base-uncased"} {
		t.Run(name, func(t *testing.T) {
			tok, err := Load(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tok, readGolden(t, filepath.Join("testdata", name+".edge.jsonl")), name)
		})
	}
}

// TestShippedTokenizer checks the tokenizer memfit trained for its tiny LLaMA (pretrained/llama-tiny, made by
// finetune pretrain tokenizer) against Hugging Face tokenizers' encodings of the edge-case strings.
func TestShippedTokenizer(t *testing.T) {
	tok, err := Load(filepath.Join("..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 4096 {
		t.Errorf("vocab %d", tok.VocabSize())
	}
	checkGolden(t, tok, readGolden(t, filepath.Join("testdata", "memfit-bpe4k.edge.jsonl")), "memfit-bpe4k")
	for _, s := range []string{"<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"} {
		if _, ok := tok.TokenID(s); !ok {
			t.Errorf("no %s", s)
		}
	}
	bos, _ := tok.BOS()
	eos, _ := tok.EOS()
	pad, _ := tok.Pad()
	if bos != 4093 || eos != 4094 || pad != 4095 {
		t.Errorf("bos %d eos %d pad %d", bos, eos, pad)
	}
}
