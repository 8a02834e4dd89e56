package preference_test

import (
	"path/filepath"

	"github.com/gomlx/gomlx/core/tensors"
	"slices"
	"testing"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/preference"
	"github.com/memfit/memfit/tokenizer"
)

func loadTokenizer(t *testing.T, path string) *tokenizer.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestEncodeStandard: the prompt with BOS (the tokenizer's post-processor), each completion tokenized on its own
// and ended by EOS, as TRL's tokenize_row; a completion that already ends with EOS gets no second one.
func TestEncodeStandard(t *testing.T) {
	tok := loadTokenizer(t, filepath.Join("..", "pretrained", "llama-tiny"))
	bos, _ := tok.BOS()
	eos, _ := tok.EOS()
	p := data.Preference{Prompt: data.Text{String: "The sky is"}, Chosen: data.Text{String: " blue."},
		Rejected: data.Text{String: " green.<|end_of_text|>"}}
	enc, err := preference.Encode(tok, nil, p)
	if err != nil {
		t.Fatal(err)
	}
	wantPrompt := append([]int{bos}, tok.Encode("The sky is", false)...)
	wantChosen := append(tok.Encode(" blue.", false), eos)
	wantRejected := tok.Encode(" green.<|end_of_text|>", false)
	if wantRejected[len(wantRejected)-1] != eos {
		t.Fatalf("the tokenizer does not encode <|end_of_text|> as EOS: %v", wantRejected)
	}
	if !slices.Equal(enc.Prompt, wantPrompt) || !slices.Equal(enc.Chosen, wantChosen) || !slices.Equal(enc.Rejected, wantRejected) {
		t.Errorf("encoded %+v, want prompt %v chosen %v rejected %v", enc, wantPrompt, wantChosen, wantRejected)
	}
}

// TestEncodeConversational renders a conversational pair with the Llama-3 template: the prompt ends with the
// assistant header (add_generation_prompt), each completion is the reply and its <|eot_id|>; prompt + completion
// decodes to the Hugging Face template's rendering of the whole conversation.
func TestEncodeConversational(t *testing.T) {
	tok := loadTokenizer(t, filepath.Join(golden.SharedDir(t), "tokenizers", "llama3"))
	p := data.Preference{
		Prompt:   data.Text{Messages: []data.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "What color is the sky?"}}},
		Chosen:   data.Text{Messages: []data.Message{{Role: "assistant", Content: "It is blue."}}},
		Rejected: data.Text{Messages: []data.Message{{Role: "assistant", Content: "It is green."}}},
	}
	builtin, err := chattemplate.Resolve(tok, chattemplate.Llama3)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := preference.Encode(tok, builtin, p)
	if err != nil {
		t.Fatal(err)
	}
	// The model's own Jinja template (tokenizer_config.json's, which always ends with the assistant's header)
	// gives the same tokens: the completion stops at the reply's end of turn.
	model, err := chattemplate.Resolve(tok, chattemplate.Model)
	if err != nil {
		t.Fatal(err)
	}
	if jinja, err := preference.Encode(tok, model, p); err != nil || !slices.Equal(jinja.Prompt, enc.Prompt) ||
		!slices.Equal(jinja.Chosen, enc.Chosen) || !slices.Equal(jinja.Rejected, enc.Rejected) {
		t.Errorf("the model's Jinja template: %+v, %v; the built-in llama3: %+v", jinja, err, enc)
	}
	prompt := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nWhat color is the sky?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	if got := tok.Decode(enc.Prompt, false); got != prompt {
		t.Errorf("prompt %q, want %q", got, prompt)
	}
	if got := tok.Decode(enc.Chosen, false); got != "It is blue.<|eot_id|>" {
		t.Errorf("chosen %q", got)
	}
	if got := tok.Decode(enc.Rejected, false); got != "It is green.<|eot_id|>" {
		t.Errorf("rejected %q", got)
	}
}

// TestTensorsTruncate: prompts keep their end (max prompt length), prompt + completion keeps its start (sequence
// length), a pair whose prompt fills the sequence is refused, labels mask the prompt and the padding.
func TestTensorsTruncate(t *testing.T) {
	pairs := []preference.Encoded{
		{Prompt: []int{1, 2, 3, 4, 5}, Chosen: []int{6, 7, 8, 9}, Rejected: []int{10, 11, 12, 13, 14, 15}},
		{Prompt: []int{1, 2}, Chosen: []int{3}, Rejected: []int{4, 5}},
		{Prompt: []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, Chosen: []int{11}, Rejected: []int{12}},
	}
	ex, kept, cuts, err := preference.Tensors(pairs, preference.Lengths{SeqLen: 8, MaxPromptLen: 3}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kept, []int{0, 1, 2}) || cuts != (preference.Cuts{Prompts: 2, Completions: 1}) {
		t.Errorf("kept %v cuts %+v", kept, cuts)
	}
	ids := int32s(ex[preference.RejectedIDs])
	labels := int32s(ex[preference.RejectedLabels])
	mask := int32s(ex[preference.RejectedMask])
	const ig = loss.IgnoreIndex
	if want := []int32{3, 4, 5, 10, 11, 12, 13, 14}; !slices.Equal(ids[:8], want) {
		t.Errorf("rejected 0: %v, want %v", ids[:8], want)
	}
	if want := []int32{ig, ig, ig, 10, 11, 12, 13, 14}; !slices.Equal(labels[:8], want) {
		t.Errorf("rejected labels 0: %v, want %v", labels[:8], want)
	}
	if want := []int32{1, 2, 4, 5, 0, 0, 0, 0}; !slices.Equal(ids[8:16], want) {
		t.Errorf("rejected 1: %v, want %v", ids[8:16], want)
	}
	if want := []int32{1, 1, 1, 1, 0, 0, 0, 0}; !slices.Equal(mask[8:16], want) {
		t.Errorf("rejected mask 1: %v, want %v", mask[8:16], want)
	}
	if want := []int32{ig, ig, 4, 5, ig, ig, ig, ig}; !slices.Equal(labels[8:16], want) {
		t.Errorf("rejected labels 1: %v, want %v", labels[8:16], want)
	}
	if want := []int32{8, 9, 10, 12, 0, 0, 0, 0}; !slices.Equal(ids[16:], want) {
		t.Errorf("rejected 2: %v, want %v", ids[16:], want)
	}
	// Without a prompt limit the third pair's prompt fills the sequence: refused.
	_, kept, cuts, err = preference.Tensors(pairs, preference.Lengths{SeqLen: 8}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kept, []int{0, 1}) || cuts != (preference.Cuts{Completions: 1, Refused: 1}) {
		t.Errorf("no prompt limit: kept %v cuts %+v", kept, cuts)
	}
	if _, _, _, err := preference.Tensors(pairs[2:], preference.Lengths{SeqLen: 8}, 0); err == nil {
		t.Error("no pair kept: no error")
	}
}

func int32s(x *tensors.Tensor) []int32 {
	var out []int32
	for _, v := range gtest.Float32s(x) {
		out = append(out, int32(v))
	}
	return out
}
