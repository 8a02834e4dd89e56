package models

import (
	"fmt"
	"math"

	"github.com/gomlx/compute/dtypes/bfloat16"
	"github.com/gomlx/compute/dtypes/float16"
	"github.com/gomlx/gomlx/core/tensors"
)

// NonFiniteError is CheckFinite's error: a weight tensor holds NaN or an infinity.
type NonFiniteError struct {
	// Name is the tensor's name, Index the position of its first non-finite value and Value that value (NaN,
	// +Inf or -Inf).
	Name  string
	Index []int
	Value float64
}

// Where names the tensor, the position and the value: `tensor "x" holds NaN at [3 17]`.
func (e *NonFiniteError) Where() string {
	return fmt.Sprintf("tensor %q holds %v at %v", e.Name, e.Value, e.Index)
}

// Error is Where and why it stops a load, in one line.
func (e *NonFiniteError) Error() string {
	return e.Where() + ", its first non-finite value: memfit loads only finite weights (was it saved from a diverged run?)"
}

// CheckFinite returns a *NonFiniteError naming the first NaN or infinite value of a float tensor (float32,
// float64, float16 or bfloat16), or nil; other dtypes are not checked. It is one pass over the host data, with
// no conversion: loading calls it on every weight.
func CheckFinite(t *tensors.Tensor, name string) error {
	at, value := -1, 0.0
	t.MustConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []float32:
			for i, v := range f {
				if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
					at, value = i, float64(v)
					return
				}
			}
		case []float64:
			for i, v := range f {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					at, value = i, v
					return
				}
			}
		case []float16.Float16:
			for i, v := range f {
				if v.Bits()&0x7c00 == 0x7c00 {
					at, value = i, v.Float64()
					return
				}
			}
		case []bfloat16.BFloat16:
			for i, v := range f {
				if v.Bits()&0x7f80 == 0x7f80 {
					at, value = i, v.Float64()
					return
				}
			}
		}
	})
	if at < 0 {
		return nil
	}
	return &NonFiniteError{Name: name, Index: unflatten(t, at), Value: value}
}

// CheckAllFinite runs CheckFinite over p in name order and returns the first error.
func CheckAllFinite(p Params) error {
	for _, n := range p.Names() {
		if err := CheckFinite(p[n], n); err != nil {
			return err
		}
	}
	return nil
}

// unflatten returns the multi-index of flat position i of t.
func unflatten(t *tensors.Tensor, i int) []int {
	idx := make([]int, t.Rank())
	for r := t.Rank() - 1; r >= 0; r-- {
		idx[r] = i % t.Shape().Dim(r)
		i /= t.Shape().Dim(r)
	}
	return idx
}
