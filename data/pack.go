package data

import (
	"fmt"
	"sort"

	"github.com/gomlx/gomlx/core/tensors"
)

// PackedExamples is what PackExamples made: the examples and how full their sequences are.
type PackedExamples struct {
	// Tensors are input_ids, attention_mask, labels and position_ids, int32 [rows, length].
	Tensors map[string]*tensors.Tensor
	// Rows is the number of sequences, Docs the examples packed into them, RealTokens their tokens (the rest of
	// Rows x length is padding).
	Rows, Docs, RealTokens int
}

// PackExamples packs supervised examples (token ids with their labels, IgnoreIndex where nothing is learned,
// each at most length tokens) several to a sequence of length tokens, first-fit decreasing: examples are taken
// longest first and each goes into the first sequence with room for it, so sequences come out nearly full. The
// result has the tensors of TokenExamples and position_ids, the position of each token within its own example
// (0 at each example's first token): the model restarts its positions there and lets no token attend across an
// example's start (llama.Model.ForwardPacked), the document-aware packing of Hugging Face's
// DataCollatorWithFlattening. The label of each example's first token is IgnoreIndex, as it is in effect
// unpacked (a causal LM predicts token t from the tokens before it, and at an example's first token those are
// another example's), so a packed batch's loss is the same as its examples' unpacked. Padding fills the end of a
// sequence as a segment of its own (positions from 0, mask 0, labels IgnoreIndex).
func PackExamples(ids, labels [][]int, length, pad int) (PackedExamples, error) {
	if length <= 0 {
		return PackedExamples{}, fmt.Errorf("sequence length must be positive, got %d", length)
	}
	if len(labels) != len(ids) {
		return PackedExamples{}, fmt.Errorf("%d label rows for %d sequences", len(labels), len(ids))
	}
	order := make([]int, len(ids))
	for i := range order {
		order[i] = i
		if len(ids[i]) > length {
			return PackedExamples{}, fmt.Errorf("example %d has %d tokens, more than the sequence length %d", i, len(ids[i]), length)
		}
		if len(labels[i]) != len(ids[i]) {
			return PackedExamples{}, fmt.Errorf("example %d: %d labels for %d ids", i, len(labels[i]), len(ids[i]))
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return len(ids[order[a]]) > len(ids[order[b]]) })
	var rows [][]int // example indices per sequence
	var free []int   // room left per sequence
	out := PackedExamples{}
	for _, e := range order {
		n := len(ids[e])
		if n == 0 {
			continue
		}
		out.Docs++
		out.RealTokens += n
		placed := false
		for r := range rows {
			if free[r] >= n {
				rows[r], free[r], placed = append(rows[r], e), free[r]-n, true
				break
			}
		}
		if !placed {
			rows, free = append(rows, []int{e}), append(free, length-n)
		}
	}
	out.Rows = len(rows)
	total := len(rows) * length
	in, mask, lab, pos := make([]int32, total), make([]int32, total), make([]int32, total), make([]int32, total)
	for r, docs := range rows {
		k := r * length
		for _, e := range docs {
			for j, id := range ids[e] {
				in[k], mask[k], lab[k], pos[k] = int32(id), 1, int32(labels[e][j]), int32(j)
				if j == 0 {
					lab[k] = IgnoreIndex
				}
				k++
			}
		}
		for j := 0; k < (r+1)*length; j, k = j+1, k+1 {
			in[k], lab[k], pos[k] = int32(pad), IgnoreIndex, int32(j)
		}
	}
	out.Tensors = map[string]*tensors.Tensor{
		"input_ids":      tensors.FromFlatDataAndDimensions(in, len(rows), length),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, len(rows), length),
		"labels":         tensors.FromFlatDataAndDimensions(lab, len(rows), length),
		"position_ids":   tensors.FromFlatDataAndDimensions(pos, len(rows), length),
	}
	return out, nil
}
