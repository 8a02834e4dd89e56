package data

import (
	"fmt"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/tokenizer"
)

// InputEncoder encodes a text, or a text pair, as an encoder model reads it: the tokenizer's special tokens and
// token type ids, truncated as transformers' truncation=True does (tokenizer.Tokenizer is one).
type InputEncoder interface {
	EncodeInputs(a, b string, pair bool, maxLength int) tokenizer.Encoding
}

// Inputs encodes the example for an encoder classifier (BERT, RoBERTa): one sentence, or the pair with the
// tokenizer's pair template (RoBERTa's <s> A </s></s> B </s>, BERT's [CLS] A [SEP] B [SEP] with token type ids 0
// then 1), cut to maxLength tokens the way transformers' tokenizer(a, b, truncation=True, max_length=...) cuts it
// (the longer text first, the special tokens kept).
func (e GLUEExample) Inputs(enc InputEncoder, maxLength int) tokenizer.Encoding {
	return enc.EncodeInputs(e.TextA, e.TextB, e.TextB != "", maxLength)
}

// EncoderExamples turns encodings with one class label (or score, for regression) each into encoder
// sequence-classification examples: input_ids, attention_mask and, when types, token_type_ids, int32
// [N, length] (padded on the right with pad, mask 0, type 0), and labels [N] (int32 classes, or float32 scores
// when scores is not nil). An encoding longer than length is an error (encode with that maximum length).
func EncoderExamples(encs []tokenizer.Encoding, classes []int, scores []float32, length, pad int, types bool) (map[string]*tensors.Tensor, error) {
	if length <= 0 {
		return nil, fmt.Errorf("sequence length must be positive, got %d", length)
	}
	n := len(encs)
	ids, mask, tt := make([]int32, n*length), make([]int32, n*length), make([]int32, n*length)
	for i, e := range encs {
		if len(e.IDs) > length {
			return nil, fmt.Errorf("example %d has %d tokens, more than the sequence length %d", i+1, len(e.IDs), length)
		}
		for j := 0; j < length; j++ {
			k := i*length + j
			if j < len(e.IDs) {
				ids[k], mask[k] = int32(e.IDs[j]), 1
				if j < len(e.TypeIDs) {
					tt[k] = int32(e.TypeIDs[j])
				}
			} else {
				ids[k] = int32(pad)
			}
		}
	}
	out := map[string]*tensors.Tensor{
		"input_ids":      tensors.FromFlatDataAndDimensions(ids, n, length),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, n, length),
	}
	if types {
		out["token_type_ids"] = tensors.FromFlatDataAndDimensions(tt, n, length)
	}
	if scores != nil || classes != nil {
		var err error
		if out["labels"], err = classLabels(classes, scores, n); err != nil {
			return nil, err
		}
	}
	return out, nil
}
