// Package safetensors reads and writes the Hugging Face safetensors format in pure Go: an 8-byte little-endian
// header length, a JSON header mapping each tensor name to its dtype, shape and byte range, then the raw
// little-endian data.
//
// Files are memory-mapped: opening one reads and validates only the header, a tensor's bytes are a slice of the
// mapping, and converting them to a GoMLX tensor copies once, so a large checkpoint never needs two copies in
// memory. Every header field is bounds-checked; a bad file is an error naming the file and the tensor, never a
// panic. Files are written atomically (temporary file, fsync, rename).
package safetensors

import (
	"fmt"

	"github.com/gomlx/compute/dtypes"
)

// DType is a safetensors dtype name.
type DType string

// The dtypes memfit reads and writes.
const (
	F64  DType = "F64"
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
	I64  DType = "I64"
	I32  DType = "I32"
	I16  DType = "I16"
	I8   DType = "I8"
	U8   DType = "U8"
	BOOL DType = "BOOL"
)

// Size returns the bytes per element, or 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case F64, I64:
		return 8
	case F32, I32:
		return 4
	case F16, BF16, I16:
		return 2
	case I8, U8, BOOL:
		return 1
	}
	return 0
}

// GoMLX returns the GoMLX dtype holding this dtype's values unchanged (F16 has none on the pure-Go backend, but
// GoMLX's Float16 type still describes it).
func (d DType) GoMLX() (dtypes.DType, error) {
	switch d {
	case F64:
		return dtypes.Float64, nil
	case F32:
		return dtypes.Float32, nil
	case F16:
		return dtypes.Float16, nil
	case BF16:
		return dtypes.BFloat16, nil
	case I64:
		return dtypes.Int64, nil
	case I32:
		return dtypes.Int32, nil
	case I16:
		return dtypes.Int16, nil
	case I8:
		return dtypes.Int8, nil
	case U8:
		return dtypes.Uint8, nil
	case BOOL:
		return dtypes.Bool, nil
	}
	return dtypes.InvalidDType, fmt.Errorf("unsupported safetensors dtype %q", string(d))
}

// FromGoMLX returns the safetensors dtype of a GoMLX dtype.
func FromGoMLX(dt dtypes.DType) (DType, error) {
	switch dt {
	case dtypes.Float64:
		return F64, nil
	case dtypes.Float32:
		return F32, nil
	case dtypes.Float16:
		return F16, nil
	case dtypes.BFloat16:
		return BF16, nil
	case dtypes.Int64:
		return I64, nil
	case dtypes.Int32:
		return I32, nil
	case dtypes.Int16:
		return I16, nil
	case dtypes.Int8:
		return I8, nil
	case dtypes.Uint8:
		return U8, nil
	case dtypes.Bool:
		return BOOL, nil
	}
	return "", fmt.Errorf("GoMLX dtype %s has no safetensors equivalent", dt)
}

// IsFloat reports whether the dtype is a floating-point format.
func (d DType) IsFloat() bool { return d == F64 || d == F32 || d == F16 || d == BF16 }
