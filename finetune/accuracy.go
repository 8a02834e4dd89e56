package finetune

import (
	"fmt"

	"github.com/gomlx/gomlx/core/tensors"
)

// Accuracy returns the fraction of data's examples whose highest logit is at their label. logits computes a
// batch's logits ([B, classes]); it is called on consecutive slices of batchSize examples (the last one may be
// shorter). data must hold "labels" ([N] integers) besides the model inputs.
func Accuracy(logits func(Batch) (*tensors.Tensor, error), data Examples, batchSize int) (float64, error) {
	labelsT, ok := data["labels"]
	if !ok {
		return 0, fmt.Errorf("accuracy needs labels")
	}
	labels, err := intValues(labelsT)
	if err != nil {
		return 0, err
	}
	n := data.Len()
	if n == 0 || batchSize <= 0 {
		return 0, fmt.Errorf("accuracy needs examples and a positive batch size (got %d, %d)", n, batchSize)
	}
	correct := 0
	for start := 0; start < n; start += batchSize {
		idx := make([]int, 0, batchSize)
		for i := start; i < min(n, start+batchSize); i++ {
			idx = append(idx, i)
		}
		batch := Batch{}
		for name, t := range data {
			if name == "labels" {
				continue
			}
			if batch[name], err = gatherRows(t, idx); err != nil {
				return 0, err
			}
		}
		out, err := logits(batch)
		if err != nil {
			return 0, err
		}
		dims := out.Shape().Dimensions
		if len(dims) != 2 || dims[0] != len(idx) {
			return 0, fmt.Errorf("logits have shape %v, want [%d, classes]", dims, len(idx))
		}
		err = tensors.ConstFlatData[float32](out, func(f []float32) {
			for r, i := range idx {
				row := f[r*dims[1] : (r+1)*dims[1]]
				best := 0
				for c, v := range row {
					if v > row[best] {
						best = c
					}
				}
				if best == labels[i] {
					correct++
				}
			}
		})
		out.MustFinalizeAll()
		if err != nil {
			return 0, err
		}
		for _, t := range batch {
			t.MustFinalizeAll()
		}
	}
	return float64(correct) / float64(n), nil
}

// intValues returns an integer tensor's values.
func intValues(t *tensors.Tensor) ([]int, error) {
	var out []int
	var err error
	t.MustConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []int32:
			for _, v := range f {
				out = append(out, int(v))
			}
		case []int64:
			for _, v := range f {
				out = append(out, int(v))
			}
		default:
			err = fmt.Errorf("labels must be int32 or int64, got %s", t.DType())
		}
	})
	return out, err
}
