package tokenizer_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/hfref"
	"github.com/memfit/memfit/tokenizer"
	"github.com/memfit/memfit/tokenizer/bpetrain"
)

func str(s string) *string { return &s }

// pairInputs are texts and pairs that exercise the post-processors and truncation: short and long sides, either
// side longer, empty texts, punctuation, numbers, contractions, whitespace runs and non-ASCII text.
func pairInputs() []hfref.Input {
	long := "The quick brown fox jumps over the lazy dog, and then it runs far away into the dark forest where nobody can find it again."
	return []hfref.Input{
		{A: "Hello world"},
		{A: "Hello world", B: str("How are you?")},
		{A: long, B: str("A short one.")},
		{A: "A short one.", B: str(long)},
		{A: long, B: str(long + " " + long)},
		{A: "", B: str("only the second")},
		{A: "only the first", B: str("")},
		{A: "Numbers: 1234567890 and 3.14159", B: str("can't won't I'm you're")},
		{A: "  leading   and\ttrailing  \n\n", B: str("Émigré café naïve façade")},
		{A: "日本語のテキスト", B: str("emoji 🦙🚀 mixed")},
		{A: long + " " + long},
		{A: "PCCW 's chief operating officer , Mike Butcher , and Alex Arena , the chief financial officer , will report directly to Mr So .",
			B: str("Current Chief Operating Officer Mike Butcher and Group Chief Financial Officer Alex Arena will report to So .")},
	}
}

// TestPairsAgainstHF: single texts and pairs with the tokenizer's post-processor (BERT's TemplateProcessing:
// [CLS] A [SEP] B [SEP] with type ids 0 then 1) and truncation (longest_first) give the ids and token type ids
// Hugging Face tokenizers gives: from a committed reference made by it (tools/hftokenizers), and from the
// library itself where it is installed.
func TestPairsAgainstHF(t *testing.T) {
	path := filepath.Join(golden.SharedDir(t), "tokenizers", "bert-base-uncased", "tokenizer.json")
	tok, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	inputs := pairInputs()
	for _, maxLength := range []int{0, 12, 24} {
		ref := filepath.Join("testdata", "pairs-bert-base-uncased-"+itoa(maxLength)+".jsonl")
		want := referenceFile(t, ref, path, maxLength, inputs)
		compare(t, tok, inputs, maxLength, want, "committed reference "+ref)
		if ok, _ := hfref.Available(); ok {
			compare(t, tok, inputs, maxLength, hfref.Encode(t, path, maxLength, inputs), "Hugging Face tokenizers")
		}
	}
}

// TestRobertaPairsAgainstHF: a byte-level BPE tokenizer in RoBERTa's layout (bpetrain, RobertaProcessing:
// <s> A </s></s> B </s>) encodes texts and pairs, truncated or not, as Hugging Face tokenizers does.
func TestRobertaPairsAgainstHF(t *testing.T) {
	if ok, why := hfref.Available(); !ok {
		t.Skip(why)
	}
	text, err := os.ReadFile(filepath.Join(golden.SharedDir(t), "text", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := bpetrain.Train([]string{string(text[:200_000])}, bpetrain.Options{VocabSize: 700, Layout: bpetrain.LayoutRoBERTa})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	j, err := m.TokenizerJSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(path, j, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	inputs := pairInputs()
	for _, maxLength := range []int{0, 13, 40} {
		compare(t, tok, inputs, maxLength, hfref.Encode(t, path, maxLength, inputs), "Hugging Face tokenizers")
	}
}

func compare(t *testing.T, tok *tokenizer.Tokenizer, inputs []hfref.Input, maxLength int, want []hfref.Encoding, source string) {
	t.Helper()
	for i, in := range inputs {
		b, pair := "", in.B != nil
		if pair {
			b = *in.B
		}
		got := tok.EncodeInputs(in.A, b, pair, maxLength)
		if !reflect.DeepEqual(got.IDs, want[i].IDs) || !reflect.DeepEqual(got.TypeIDs, want[i].TypeIDs) {
			t.Errorf("%s, max length %d, input %d (%q, %v):\n got ids %v types %v\nwant ids %v types %v", source, maxLength, i, in.A, pair,
				got.IDs, got.TypeIDs, want[i].IDs, want[i].TypeIDs)
		}
		if !pair && maxLength == 0 && !reflect.DeepEqual(got.IDs, tok.Encode(in.A, true)) {
			t.Errorf("input %d: EncodeInputs and Encode differ", i)
		}
	}
}

// referenceFile reads a committed reference, remaking it with Hugging Face tokenizers first when
// MEMFIT_UPDATE_REFERENCE is set.
func referenceFile(t *testing.T, ref, tokenizerPath string, maxLength int, inputs []hfref.Input) []hfref.Encoding {
	t.Helper()
	if os.Getenv("MEMFIT_UPDATE_REFERENCE") != "" {
		var lines []string
		for _, e := range hfref.Encode(t, tokenizerPath, maxLength, inputs) {
			lines = append(lines, `{"ids":`+ints(e.IDs)+`,"type_ids":`+ints(e.TypeIDs)+`}`)
		}
		if err := os.WriteFile(ref, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	encs, err := hfref.Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", ref, err)
	}
	if len(encs) != len(inputs) {
		t.Fatalf("%s holds %d encodings for %d inputs: remake it (MEMFIT_UPDATE_REFERENCE=1)", ref, len(encs), len(inputs))
	}
	return encs
}

func ints(v []int) string {
	var sb strings.Builder
	sb.WriteByte('[')
	for i, x := range v {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(itoa(x))
	}
	sb.WriteByte(']')
	return sb.String()
}

func itoa(n int) string { return strconv.Itoa(n) }
