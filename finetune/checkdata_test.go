package finetune_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
)

// TestCheckExamples: a whole in-memory dataset is checked against the model at once, and the first bad example
// is named by its index: a class label past the classes, a token id past the vocabulary, a mask value other than
// 0 and 1, an LM label past the vocabulary, sequences longer than the model's positions, and tensors whose
// shapes do not go together. Good data passes.
func TestCheckExamples(t *testing.T) {
	vitModel, images := imageTask(t, vit.Options{})
	lm, text := textTask(t, decoder.Options{})
	if err := finetune.CheckExamples(vitModel, images); err != nil {
		t.Fatalf("good images: %v", err)
	}
	if err := finetune.CheckExamples(lm, text); err != nil {
		t.Fatalf("good text: %v", err)
	}
	// with returns ex with tensor name's flat element at changed to v (int32 tensors).
	with := func(ex finetune.Examples, name string, at int, v int32) finetune.Examples {
		out := finetune.Examples{}
		for n, x := range ex {
			out[n] = x
		}
		var f []int32
		ex[name].MustConstFlatData(func(a any) { f = slices.Clone(a.([]int32)) })
		f[at] = v
		out[name] = tensors.FromFlatDataAndDimensions(f, ex[name].Shape().Dimensions...)
		return out
	}
	const seq = 12 // textTask's sequence length
	long := finetune.Examples{}
	for n, x := range text {
		var f []int32
		x.MustConstFlatData(func(a any) { f = a.([]int32) })
		var wide []int32
		for i := 0; i < 16; i++ {
			for r := 0; r < 11; r++ { // 132 tokens per row > the tiny preset's 128 positions
				wide = append(wide, f[i*seq:(i+1)*seq]...)
			}
		}
		long[n] = tensors.FromFlatDataAndDimensions(wide, 16, 11*seq)
	}
	shortMask := finetune.Examples{"input_ids": text["input_ids"], "labels": text["labels"],
		"attention_mask": tensors.FromFlatDataAndDimensions(make([]int32, 16*5), 16, 5)}
	for _, tc := range []struct {
		name  string
		model finetune.Model
		ex    finetune.Examples
		want  []string
	}{
		{"class label", vitModel, with(images, "labels", 17, 3), []string{"example 17 of 24", "labels holds 3", "3 classes"}},
		{"token id", lm, with(text, "input_ids", 7*seq+4, 300), []string{"example 7 of 16", "input_ids holds 300", "vocabulary"}},
		{"negative token id", lm, with(text, "input_ids", 2*seq, -1), []string{"example 2 of 16", "input_ids holds -1"}},
		{"mask value", lm, with(text, "attention_mask", 11*seq+1, 2), []string{"example 11 of 16", "attention_mask holds 2"}},
		{"LM label", lm, with(text, "labels", 15*seq+3, 256), []string{"example 15 of 16", "labels holds 256"}},
		{"sequence length", lm, long, []string{"132 tokens", "128 positions"}},
		{"mask shape", lm, shortMask, []string{"attention_mask has shape [16 5] but input_ids [16 12]"}},
	} {
		err := finetune.CheckExamples(tc.model, tc.ex)
		if err == nil {
			t.Errorf("%s: not refused", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: more than one line: %q", tc.name, err)
		}
	}
}
