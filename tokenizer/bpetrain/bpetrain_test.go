package bpetrain

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// The Llama-3 split of these strings, worked out from the regex's branches (and what Hugging Face tokenizers
// gives for the same pre-tokenizer).
func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"hello  world", []string{"hello", " ", " world"}},
		{"I'm 12345 ok", []string{"I", "'m", " ", "123", "45", " ok"}},
		{"a\n\n  b", []string{"a", "\n\n", " ", " b"}},
		{"end.  ", []string{"end", ".", "  "}},
		{"x = y+1;", []string{"x", " =", " y", "+", "1", ";"}},
		{"Don'T", []string{"Don", "'T"}},
		{"naïve café", []string{"naïve", " café"}},
	} {
		if got := Split(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Split(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Join(Split(tc.in), "") != tc.in {
			t.Errorf("Split(%q) loses text", tc.in)
		}
	}
}

func TestTrain(t *testing.T) {
	text := strings.Repeat("the cat sat on the mat. the cat ate the rat.\n", 50)
	m, err := Train([]string{text}, Options{VocabSize: 270, Special: []string{"<s>", "</s>"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Vocab) != 270 || len(m.Merges) != 270-256-2 {
		t.Fatalf("vocab %d, merges %d", len(m.Vocab), len(m.Merges))
	}
	// The most frequent pair of this text is "t"+"h" or "Ġ"+"t"..., whatever it is, it must be the most frequent:
	// " the" occurs 200 times, so the first merges build it.
	seen := map[string]bool{}
	for i, s := range m.Vocab {
		if seen[s] {
			t.Fatalf("token %q twice", s)
		}
		seen[s] = true
		if i >= 256 && i < 256+len(m.Merges) && s != m.Merges[i-256][0]+m.Merges[i-256][1] {
			t.Fatalf("token %d %q is not its merge %q", i, s, m.Merges[i-256])
		}
	}
	if !seen[ByteLevel(" the")] {
		t.Errorf("no token for \" the\" after %d merges: %q", len(m.Merges), m.Vocab[256:])
	}
	data, err := m.TokenizerJSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Model struct {
			Vocab  map[string]int `json:"vocab"`
			Merges [][]string     `json:"merges"`
		} `json:"model"`
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Model.Vocab) != 268 || len(doc.Model.Merges) != 12 || doc.Added[1].ID != 269 || doc.Added[1].Content != "</s>" {
		t.Errorf("tokenizer.json: %d vocab, %d merges, added %+v", len(doc.Model.Vocab), len(doc.Model.Merges), doc.Added)
	}
	// Deterministic: the same input trains the same model.
	again, _ := Train([]string{text}, Options{VocabSize: 270, Special: []string{"<s>", "</s>"}})
	if !reflect.DeepEqual(again, m) {
		t.Error("training is not deterministic")
	}
	if _, err := Train(nil, Options{VocabSize: 100}); err == nil {
		t.Error("a vocabulary below 256 bytes was accepted")
	}
}

// GPT-2's split (RoBERTa's ByteLevel pre-tokenizer) of these strings, worked out from the regex's branches; the
// RoBERTa layout's encodings are checked against Hugging Face tokenizers in the tokenizer package's tests.
func TestSplitGPT2(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"hello  world", []string{"hello", " ", " world"}},
		{"I'm 12345 ok", []string{"I", "'m", " 12345", " ok"}},
		{"a\n\n b", []string{"a", "\n\n", " b"}},
		{"end.  ", []string{"end", ".", "  "}},
		{"x = y+1;", []string{"x", " =", " y", "+", "1", ";"}},
		{"Don'T", []string{"Don", "'", "T"}},
	} {
		if got := SplitGPT2(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("SplitGPT2(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
