package data

import (
	"fmt"

	"github.com/gomlx/gomlx/core/tensors"
)

// IgnoreIndex is the label of positions that take no part in the loss.
const IgnoreIndex = -100

// TokenExamples turns token sequences into LLaMA causal-LM examples of one length: input_ids, attention_mask
// and labels, all int32 [N, length]. Rows are cut at length and padded on the right with pad (mask 0, label
// IgnoreIndex). labels nil means labels = ids (plain language modelling; the model shifts them); otherwise
// labels[i] goes with ids[i] (IgnoreIndex on prompt tokens, for instruction tuning).
func TokenExamples(ids, labels [][]int, length, pad int) (map[string]*tensors.Tensor, error) {
	if length <= 0 {
		return nil, fmt.Errorf("sequence length must be positive, got %d", length)
	}
	if labels != nil && len(labels) != len(ids) {
		return nil, fmt.Errorf("%d label rows for %d sequences", len(labels), len(ids))
	}
	n := len(ids)
	in := make([]int32, n*length)
	mask := make([]int32, n*length)
	lab := make([]int32, n*length)
	for i, row := range ids {
		var lrow []int
		if labels != nil {
			if len(labels[i]) != len(row) {
				return nil, fmt.Errorf("row %d: %d labels for %d ids", i, len(labels[i]), len(row))
			}
			lrow = labels[i]
		}
		for j := 0; j < length; j++ {
			k := i*length + j
			if j < len(row) {
				in[k], mask[k], lab[k] = int32(row[j]), 1, int32(row[j])
				if lrow != nil {
					lab[k] = int32(lrow[j])
				}
			} else {
				in[k], lab[k] = int32(pad), IgnoreIndex
			}
		}
	}
	return map[string]*tensors.Tensor{
		"input_ids":      tensors.FromFlatDataAndDimensions(in, n, length),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, n, length),
		"labels":         tensors.FromFlatDataAndDimensions(lab, n, length),
	}, nil
}

// ClassExamples turns token sequences with one class label (or score, for regression) each into LLaMA
// sequence-classification examples: input_ids and attention_mask int32 [N, length] (cut at length, padded on the
// right with pad, which the model's pad_token_id must equal so it pools the last real token) and labels [N]
// (int32 classes, or float32 scores when scores is not nil).
func ClassExamples(ids [][]int, classes []int, scores []float32, length, pad int) (map[string]*tensors.Tensor, error) {
	ex, err := TokenExamples(ids, nil, length, pad)
	if err != nil {
		return nil, err
	}
	if ex["labels"], err = classLabels(classes, scores, len(ids)); err != nil {
		return nil, err
	}
	return ex, nil
}

// classLabels returns the labels [n] of n sequences: float32 scores when scores is not nil, else int32 classes.
func classLabels(classes []int, scores []float32, n int) (*tensors.Tensor, error) {
	if scores != nil {
		if len(scores) != n {
			return nil, fmt.Errorf("%d scores for %d sequences", len(scores), n)
		}
		return tensors.FromFlatDataAndDimensions(append([]float32(nil), scores...), n), nil
	}
	if len(classes) != n {
		return nil, fmt.Errorf("%d labels for %d sequences", len(classes), n)
	}
	lab := make([]int32, n)
	for i, c := range classes {
		lab[i] = int32(c)
	}
	return tensors.FromFlatDataAndDimensions(lab, n), nil
}
