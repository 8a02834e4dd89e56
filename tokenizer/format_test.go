package tokenizer

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

func loadShared(t *testing.T, name string) *Tokenizer {
	t.Helper()
	tok, err := Load(filepath.Join(golden.SharedDir(t), "tokenizers", name))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestEncodeBatch(t *testing.T) {
	tok := loadShared(t, "mistral")
	texts := []string{"Hello world", "I believe the meaning of life is", ""}
	b, err := tok.EncodeBatch(texts, BatchOptions{AddSpecial: true, MaxLength: 5, PadSide: Left})
	if err != nil {
		t.Fatal(err)
	}
	full := tok.Encode(texts[1], true)
	want := [][]int{{0, 0, 1, 22557, 1526}, full[:5], {0, 0, 0, 0, 1}}
	if !reflect.DeepEqual(b.IDs, want) {
		t.Errorf("ids %v, want %v", b.IDs, want)
	}
	if !reflect.DeepEqual(b.AttentionMask, [][]int{{0, 0, 1, 1, 1}, {1, 1, 1, 1, 1}, {0, 0, 0, 0, 1}}) {
		t.Errorf("mask %v", b.AttentionMask)
	}
	b, _ = tok.EncodeBatch(texts[:2], BatchOptions{AddSpecial: true, MaxLength: 4, Truncation: Left, PadToMax: true})
	if !reflect.DeepEqual(b.IDs[1], full[len(full)-4:]) || len(b.IDs[0]) != 4 || !reflect.DeepEqual(b.AttentionMask[0], []int{1, 1, 1, 0}) {
		t.Errorf("left truncation / right padding: %v %v", b.IDs, b.AttentionMask)
	}
	if _, err := tok.EncodeBatch(texts, BatchOptions{PadToMax: true}); err == nil {
		t.Error("PadToMax without MaxLength accepted")
	}
}

func TestFormatInstruction(t *testing.T) {
	tok := loadShared(t, "mistral")
	ids, labels := tok.FormatInstruction("Name a colour.", "", "Blue.")
	if len(ids) != len(labels) {
		t.Fatalf("%d ids, %d labels", len(ids), len(labels))
	}
	prompt := tok.Encode(AlpacaPrompt("Name a colour.", ""), true)
	for i := range prompt {
		if labels[i] != IgnoreIndex {
			t.Fatalf("prompt token %d is learned", i)
		}
	}
	var learned []int
	for _, l := range labels[len(prompt):] {
		if l == IgnoreIndex {
			t.Fatal("a response token is masked")
		}
		learned = append(learned, l)
	}
	if eos, _ := tok.EOS(); learned[len(learned)-1] != eos {
		t.Errorf("the response does not end with EOS: %v", learned)
	}
	if got := tok.Decode(learned, true); got != "Blue." {
		t.Errorf("learned tokens decode to %q", got)
	}
	if !strings.Contains(AlpacaPrompt("x", "y"), "### Input:\ny\n\n### Response:\n") {
		t.Error("the prompt with input lacks its input section")
	}
}

func TestFormatChatLlama3(t *testing.T) {
	tok := loadShared(t, "llama3")
	if tok.ChatFormat() != ChatLlama3 {
		t.Fatalf("chat format %q", tok.ChatFormat())
	}
	msgs := []Message{{"system", "Be brief."}, {"user", " Hi! "}, {"assistant", "Hello."}}
	ids, labels, err := tok.FormatChat(msgs, "", false)
	if err != nil {
		t.Fatal(err)
	}
	// The chat template's rendering (trimmed contents, BOS first), encoded as one string.
	rendered := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
	if want := tok.Encode(rendered, false); !reflect.DeepEqual(ids, want) {
		t.Errorf("ids %v\nwant %v", ids, want)
	}
	var learned []int
	for _, l := range labels {
		if l != IgnoreIndex {
			learned = append(learned, l)
		}
	}
	if got := tok.Decode(learned, false); got != "Hello.<|eot_id|>" {
		t.Errorf("learned %q", got)
	}
	if _, _, err := loadShared(t, "bert-base-uncased").FormatChat(msgs, "", false); err == nil {
		t.Error("BERT has no chat template, yet FormatChat rendered one")
	}
}
