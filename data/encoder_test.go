package data_test

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/hfref"
	"github.com/memfit/memfit/tokenizer"
	"github.com/memfit/memfit/tokenizer/bpetrain"
)

// TestGLUEPairsAsHF: the pair tasks' dev examples (MRPC, STS-B, RTE) and a single-sentence task's (SST-2), encoded
// for an encoder at the paper's 128 tokens and at 24 (most pairs truncated), give the ids and token type ids
// Hugging Face tokenizers gives for tokenizer(a, b, truncation=True, max_length=N): with BERT's WordPiece
// tokenizer and with a byte-level BPE tokenizer in RoBERTa's layout.
func TestGLUEPairsAsHF(t *testing.T) {
	if ok, why := hfref.Available(); !ok {
		t.Skip(why)
	}
	shared := golden.SharedDir(t)
	text, err := os.ReadFile(filepath.Join(shared, "text", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := bpetrain.Train([]string{string(text[:150_000])}, bpetrain.Options{VocabSize: 600, Layout: bpetrain.LayoutRoBERTa})
	if err != nil {
		t.Fatal(err)
	}
	j, _ := m.TokenizerJSON()
	roberta := filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(roberta, j, 0o644); err != nil {
		t.Fatal(err)
	}
	var examples []data.GLUEExample
	for _, task := range []string{data.MRPC, data.STSB, data.RTE, data.SST2} {
		ex, err := data.ReadGLUE(filepath.Join(shared, "glue"), task, "dev")
		if err != nil {
			t.Fatal(err)
		}
		examples = append(examples, ex[:40]...)
	}
	inputs := make([]hfref.Input, len(examples))
	for i, e := range examples {
		inputs[i] = hfref.Input{A: e.TextA}
		if e.TextB != "" {
			b := e.TextB
			inputs[i].B = &b
		}
	}
	for _, path := range []string{filepath.Join(shared, "tokenizers", "bert-base-uncased", "tokenizer.json"), roberta} {
		tok, err := tokenizer.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, maxLength := range []int{128, 24} {
			want := hfref.Encode(t, path, maxLength, inputs)
			bad := 0
			for i, e := range examples {
				got := e.Inputs(tok, maxLength)
				if !reflect.DeepEqual(got.IDs, want[i].IDs) || !reflect.DeepEqual(got.TypeIDs, want[i].TypeIDs) {
					if bad++; bad <= 3 {
						t.Errorf("%s, max length %d, example %d:\n got %v %v\nwant %v %v", path, maxLength, i, got.IDs, got.TypeIDs, want[i].IDs, want[i].TypeIDs)
					}
				}
			}
			if bad > 0 {
				t.Errorf("%s, max length %d: %d of %d examples differ", path, maxLength, bad, len(examples))
			}
		}
	}
}

// TestEncoderExamples: encodings become padded input_ids, attention_mask, token_type_ids and labels.
func TestEncoderExamples(t *testing.T) {
	encs := []tokenizer.Encoding{{IDs: []int{0, 5, 2, 2, 6, 2}, TypeIDs: []int{0, 0, 0, 1, 1, 1}}, {IDs: []int{0, 7, 2}, TypeIDs: []int{0, 0, 0}}}
	ex, err := data.EncoderExamples(encs, []int{1, 0}, nil, 6, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, want []int32) {
		t.Helper()
		var got []int32
		ex[name].ConstFlatData(func(f any) { got = append(got, f.([]int32)...) })
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("input_ids", []int32{0, 5, 2, 2, 6, 2, 0, 7, 2, 1, 1, 1})
	check("attention_mask", []int32{1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0})
	check("token_type_ids", []int32{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0})
	check("labels", []int32{1, 0})
	if _, err := data.EncoderExamples(encs, []int{1, 0}, nil, 4, 1, false); err == nil {
		t.Error("an encoding longer than the sequence was accepted")
	}
}
