package finetune_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// TestConversationsWithTheTokenizersTemplate: training data of conversations takes the tokenizer's own chat
// template under auto, as generate does: with the shared Llama-3 tokenizer (its tokenizer_config.json carries
// the original Llama-3 template, rendered by the Jinja engine) each row is the Llama-3 rendering of its
// conversation (memfit's built-in Llama-3 rendering, and the assistant header that template writes after the
// last message even without add_generation_prompt), and its labels learn exactly the two assistant turns with
// their <|eot_id|>; packed, the same tokens and labels follow one another in one row, positions restarting,
// each conversation's first label ignored. The loader records the template as "model".
func TestConversationsWithTheTokenizersTemplate(t *testing.T) {
	tokDir := filepath.Join(golden.SharedDir(t), "tokenizers", "llama3")
	tok, err := tokenizer.Load(tokDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := llama.Preset("tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg.VocabSize = tok.VocabSize() // the data path reads the config only
	model := lm.Model{Model: &decoder.Model{Config: cfg}, Spec: llama.Spec}
	convs := [][]tokenizer.Message{
		{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi!"}, {Role: "assistant", Content: "Hello."},
			{Role: "user", Content: "Name a colour."}, {Role: "assistant", Content: "Blue."}},
		{{Role: "user", Content: "Two plus two?"}, {Role: "assistant", Content: "Four."}},
	}
	path := filepath.Join(t.TempDir(), "chat.jsonl")
	os.WriteFile(path, []byte(`{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]}`+"\n"+
		`{"conversations": [{"from": "human", "value": "Two plus two?"}, {"from": "gpt", "value": "Four."}]}`+"\n"), 0o644)
	const seqLen = 64
	ex, err := finetune.TextExamples(path, finetune.DataOptions{SeqLen: seqLen, Tokenizer: tokDir}, model, "")
	if err != nil {
		t.Fatal(err)
	}
	ids, labels := ex["input_ids"].Value().([][]int32), ex["labels"].Value().([][]int32)
	learned := []string{"Hello.<|eot_id|>Blue.<|eot_id|>", "Four.<|eot_id|>"}
	var wantIDs, wantLabels [][]int
	for i, c := range convs {
		wi, wl, err := tok.FormatChat(c, tokenizer.ChatLlama3, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range tok.Encode("<|start_header_id|>assistant<|end_header_id|>\n\n", false) {
			wi, wl = append(wi, id), append(wl, tokenizer.IgnoreIndex)
		}
		wantIDs, wantLabels = append(wantIDs, wi), append(wantLabels, wl)
		var got []int
		for j := range ids[i] {
			if j < len(wi) && (int(ids[i][j]) != wi[j] || int(labels[i][j]) != wl[j]) {
				t.Fatalf("row %d position %d: id %d label %d, want the Llama-3 rendering's %d / %d", i, j, ids[i][j], labels[i][j], wi[j], wl[j])
			}
			if j >= len(wi) && labels[i][j] != tokenizer.IgnoreIndex {
				t.Errorf("row %d: padding at %d is learned", i, j)
			}
			if labels[i][j] != tokenizer.IgnoreIndex {
				got = append(got, int(labels[i][j]))
			}
		}
		if s := tok.Decode(got, false); s != learned[i] {
			t.Errorf("row %d learns %q, want %q", i, s, learned[i])
		}
		if !strings.HasPrefix(tok.Decode(wi, false), "<|begin_of_text|><|start_header_id|>") {
			t.Errorf("row %d is not the Llama-3 template: %q", i, tok.Decode(wi, false))
		}
	}
	it, err := finetune.OpenData(path, finetune.DataOptions{SeqLen: seqLen, Tokenizer: tokDir}, model, "", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l := it.(*finetune.Loader); l.ChatTemplate != "model" || !strings.Contains(strings.Join(l.Notes, "\n"), "conversations take the chat template model (tokenizer_config.json)") {
		t.Errorf("the loader records the template %q, notes %q", l.ChatTemplate, l.Notes)
	}
	packed, err := finetune.TextExamples(path, finetune.DataOptions{SeqLen: seqLen, Tokenizer: tokDir, Packing: true}, model, "")
	if err != nil {
		t.Fatal(err)
	}
	pids, plabels, pos := packed["input_ids"].Value().([][]int32), packed["labels"].Value().([][]int32), packed["position_ids"].Value().([][]int32)
	if len(pids) != 1 {
		t.Fatalf("%d packed rows, want both conversations in one", len(pids))
	}
	k := 0
	for _, i := range []int{0, 1} { // first-fit decreasing: the longer conversation first
		for j := range wantIDs[i] {
			want := wantLabels[i][j]
			if j == 0 {
				want = tokenizer.IgnoreIndex
			}
			if int(pids[0][k]) != wantIDs[i][j] || int(plabels[0][k]) != want || int(pos[0][k]) != j {
				t.Fatalf("packed position %d: id %d label %d position %d, want conversation %d's token %d: %d / %d / %d",
					k, pids[0][k], plabels[0][k], pos[0][k], i, j, wantIDs[i][j], want, j)
			}
			k++
		}
	}
}
