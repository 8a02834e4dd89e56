package bert

import (
	"fmt"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
)

// Predict runs a sequence classifier over examples (GLUEExamples' tensors; labels are not read) in consecutive
// batches of batchSize, the last one filled up with copies of its first row so every batch has one shape, and
// returns the predicted class per example (the highest logit, the lowest class on a tie), or the score of a
// one-label regression head. logits computes a batch's logits [B, labels]. A NaN or infinite logit is an error
// naming the example.
func Predict(logits func(finetune.Batch) (*tensors.Tensor, error), examples map[string]*tensors.Tensor, batchSize int) ([]float64, error) {
	ids := examples["input_ids"]
	if ids == nil || ids.Rank() != 2 || batchSize <= 0 {
		return nil, fmt.Errorf("prediction needs input_ids [N, T] and a positive batch size")
	}
	n := ids.Shape().Dim(0)
	rows := map[string][][]int32{}
	for name, t := range examples {
		if name == "labels" {
			continue
		}
		var flat []int32
		t.MustConstFlatData(func(f any) { flat = append(flat, f.([]int32)...) })
		width := t.Shape().Dim(1)
		for i := 0; i < n; i++ {
			rows[name] = append(rows[name], flat[i*width:(i+1)*width])
		}
	}
	var out []float64
	for start := 0; start < n; start += batchSize {
		b := finetune.Batch{}
		for name, rs := range rows {
			width := len(rs[0])
			flat := make([]int32, 0, batchSize*width)
			for i := 0; i < batchSize; i++ {
				r := start + i
				if r >= n {
					r = start
				}
				flat = append(flat, rs[r]...)
			}
			b[name] = tensors.FromFlatDataAndDimensions(flat, batchSize, width)
		}
		l, err := logits(b)
		for _, t := range b {
			t.FinalizeAll()
		}
		if err != nil {
			return nil, err
		}
		classes := l.Shape().Dim(1)
		var bad error
		l.MustConstFlatData(func(f any) {
			v := f.([]float32)
			for i := 0; i < batchSize && start+i < n; i++ {
				row := v[i*classes : (i+1)*classes]
				best := 0
				for c, x := range row {
					if x-x != 0 && bad == nil {
						bad = fmt.Errorf("example %d: the classifier's logits are not finite (%v): its weights or adapter hold NaN or infinite values; no metric is reported", start+i+1, x)
					}
					if x > row[best] {
						best = c
					}
				}
				if classes == 1 {
					out = append(out, float64(row[0]))
				} else {
					out = append(out, float64(best))
				}
			}
		})
		l.FinalizeAll()
		if bad != nil {
			return nil, bad
		}
	}
	return out, nil
}
