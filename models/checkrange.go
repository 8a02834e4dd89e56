package models

import (
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/core/tensors"
)

// CheckRange returns an error naming the first integer of t (int32 or int64) outside [lo, hi) and not among
// allowed, with its position, the range and why (what the range is: "the model's vocabulary has 4096 tokens",
// ...), or nil. Inputs are checked with it before a graph would gather with them (a gather clamps an
// out-of-range index: a silent wrong result).
func CheckRange(t *tensors.Tensor, name string, lo, hi int, why string, allowed ...int) error {
	bad := 0
	at := FindInt(t, func(_ int, v int64) bool {
		if (v < int64(lo) || v >= int64(hi)) && !slices.Contains(allowed, int(v)) {
			bad = int(v)
			return true
		}
		return false
	})
	if at < 0 {
		return nil
	}
	return fmt.Errorf("%s holds %d at %v, outside [%d, %d): %s", name, bad, unflatten(t, at), lo, hi, why)
}

// FindInt returns the flat index of the first integer of t (int32 or int64) for which match holds, or -1 (also
// for other dtypes).
func FindInt(t *tensors.Tensor, match func(i int, v int64) bool) int {
	at := -1
	t.MustConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []int32:
			for i, v := range f {
				if match(i, int64(v)) {
					at = i
					return
				}
			}
		case []int64:
			for i, v := range f {
				if match(i, v) {
					at = i
					return
				}
			}
		}
	})
	return at
}
