// Package gguf reads and writes GGUF v3 files, the single-file model format of llama.cpp and Ollama: a header
// of typed metadata key/values and tensor infos, then the tensor data, each tensor aligned to general.alignment
// (32 bytes by default). Tensors are stored as f32, f16, bf16 or q8_0 (blocks of 32 values: an f16 scale and 32 int8,
// rounded as llama.cpp's reference quantizer rounds). Reading is bounded by the file's size: a truncated or
// malformed file, or one declaring more items than it can hold, is an error, never a panic or an allocation
// sized by the declared counts.
package gguf

import (
	"fmt"
	"math"

	"github.com/memfit/memfit/safetensors"
)

// Magic is the first four bytes of a GGUF file; Version the format version this package writes (it reads 2 and 3).
const (
	Magic   = "GGUF"
	Version = 3
)

// DefaultAlignment is the data alignment when general.alignment is absent; KeyAlignment sets another.
const (
	DefaultAlignment = 32
	KeyAlignment     = "general.alignment"
)

// ValueType is the type code of a metadata value.
type ValueType uint32

// Metadata value types (GGUF's gguf_type).
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

// size returns the bytes of one value of a fixed-size type (0 for string and array).
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// TensorType is a ggml tensor type code.
type TensorType uint32

// The tensor types this package reads and writes.
const (
	F32  TensorType = 0
	F16  TensorType = 1
	Q8_0 TensorType = 8
	BF16 TensorType = 30
)

// QK8_0 is the number of values in a q8_0 block; a block takes 2 bytes of f16 scale and 32 int8.
const (
	QK8_0        = 32
	blockQ8Bytes = 2 + QK8_0
)

// String returns the type's llama.cpp name.
func (t TensorType) String() string {
	switch t {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case Q8_0:
		return "q8_0"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("ggml type %d", uint32(t))
}

// ParseTensorType returns the type named s (f32, f16, bf16 or q8_0).
func ParseTensorType(s string) (TensorType, error) {
	switch s {
	case "f32":
		return F32, nil
	case "f16":
		return F16, nil
	case "bf16":
		return BF16, nil
	case "q8_0":
		return Q8_0, nil
	}
	return 0, fmt.Errorf("unknown GGUF tensor type %q: use f32, f16, bf16 or q8_0", s)
}

// Bytes returns the size in bytes of n values of type t (n a multiple of 32 for q8_0), or an error for a type
// this package does not know or a count that does not fit.
func (t TensorType) Bytes(n uint64) (uint64, error) {
	switch t {
	case F32:
		if n > math.MaxUint64/4 {
			return 0, fmt.Errorf("%d values overflow", n)
		}
		return 4 * n, nil
	case F16, BF16:
		if n > math.MaxUint64/2 {
			return 0, fmt.Errorf("%d values overflow", n)
		}
		return 2 * n, nil
	case Q8_0:
		if n%QK8_0 != 0 {
			return 0, fmt.Errorf("q8_0 needs rows of a multiple of %d values", QK8_0)
		}
		return n / QK8_0 * blockQ8Bytes, nil
	}
	return 0, fmt.Errorf("tensor type %s is not supported (f32, f16, bf16 and q8_0 are)", t)
}

// KV is one metadata key and its value. Values are uint8, int8, uint16, int16, uint32, int32, float32, bool,
// string, uint64, int64 or float64, or a slice of one of them (an array).
type KV struct {
	Key   string
	Value any
}

// TensorInfo describes one tensor: its name, its dimensions in ggml's order (Dims[0] varies fastest: a Hugging
// Face [out, in] matrix has Dims [in, out]), its type and its data offset (from the start of the data section).
type TensorInfo struct {
	Name   string
	Dims   []uint64
	Type   TensorType
	Offset uint64
}

// Elements returns the number of values of the tensor (0 when it overflows).
func (ti TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range ti.Dims {
		if d != 0 && n > math.MaxUint64/d {
			return 0
		}
		n *= d
	}
	return n
}

// Bytes returns the tensor's data size.
func (ti TensorInfo) Bytes() (uint64, error) {
	if len(ti.Dims) > 0 && ti.Type == Q8_0 && ti.Dims[0]%QK8_0 != 0 {
		return 0, fmt.Errorf("tensor %s: q8_0 rows of %d values are not a multiple of %d", ti.Name, ti.Dims[0], QK8_0)
	}
	n := ti.Elements()
	if n == 0 && len(ti.Dims) > 0 {
		for _, d := range ti.Dims {
			if d == 0 {
				return 0, nil
			}
		}
		return 0, fmt.Errorf("tensor %s: dimensions %v overflow", ti.Name, ti.Dims)
	}
	b, err := ti.Type.Bytes(n)
	if err != nil {
		return 0, fmt.Errorf("tensor %s: %w", ti.Name, err)
	}
	return b, nil
}

// Encode appends the values of x, stored as type t, to dst (x's length a multiple of 32 for q8_0).
func Encode(dst []byte, t TensorType, x []float32) ([]byte, error) {
	switch t {
	case F32:
		for _, v := range x {
			b := math.Float32bits(v)
			dst = append(dst, byte(b), byte(b>>8), byte(b>>16), byte(b>>24))
		}
	case F16:
		for _, v := range x {
			h := safetensors.F32ToF16(v)
			dst = append(dst, byte(h), byte(h>>8))
		}
	case BF16:
		for _, v := range x {
			h := safetensors.F32ToBF16(v)
			dst = append(dst, byte(h), byte(h>>8))
		}
	case Q8_0:
		if len(x)%QK8_0 != 0 {
			return nil, fmt.Errorf("q8_0 needs a multiple of %d values, got %d", QK8_0, len(x))
		}
		for i := 0; i < len(x); i += QK8_0 {
			dst = appendQ8Block(dst, x[i:i+QK8_0])
		}
	default:
		return nil, fmt.Errorf("tensor type %s is not supported (f32, f16, bf16 and q8_0 are)", t)
	}
	return dst, nil
}

// appendQ8Block quantizes 32 values as llama.cpp's reference q8_0 quantizer does: scale d = max|x| / 127 (stored
// as f16), each value round(x / d) in float32 with halves away from zero.
func appendQ8Block(dst []byte, x []float32) []byte {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	h := safetensors.F32ToF16(d)
	dst = append(dst, byte(h), byte(h>>8))
	for _, v := range x {
		dst = append(dst, byte(int8(math.Round(float64(v*id)))))
	}
	return dst
}

// Decode converts n values stored as type t in src to float32 into dst (len(dst) values; src must hold them).
func Decode(dst []float32, t TensorType, src []byte) error {
	n := uint64(len(dst))
	need, err := t.Bytes(n)
	if err != nil {
		return err
	}
	if uint64(len(src)) < need {
		return fmt.Errorf("%d values of %s need %d bytes, have %d", n, t, need, len(src))
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(src[4*i]) | uint32(src[4*i+1])<<8 | uint32(src[4*i+2])<<16 | uint32(src[4*i+3])<<24)
		}
	case F16:
		for i := range dst {
			dst[i] = safetensors.F16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
		}
	case BF16:
		for i := range dst {
			dst[i] = safetensors.BF16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
		}
	case Q8_0:
		for b := 0; b < len(dst)/QK8_0; b++ {
			blk := src[b*blockQ8Bytes : (b+1)*blockQ8Bytes]
			d := safetensors.F16ToF32(uint16(blk[0]) | uint16(blk[1])<<8)
			for j := range QK8_0 {
				dst[b*QK8_0+j] = float32(int8(blk[2+j])) * d
			}
		}
	}
	return nil
}

// valueType returns the metadata type code of v and, for a slice, that of its elements.
func valueType(v any) (ValueType, ValueType, error) {
	switch v.(type) {
	case uint8:
		return TypeUint8, 0, nil
	case int8:
		return TypeInt8, 0, nil
	case uint16:
		return TypeUint16, 0, nil
	case int16:
		return TypeInt16, 0, nil
	case uint32:
		return TypeUint32, 0, nil
	case int32:
		return TypeInt32, 0, nil
	case float32:
		return TypeFloat32, 0, nil
	case bool:
		return TypeBool, 0, nil
	case string:
		return TypeString, 0, nil
	case uint64:
		return TypeUint64, 0, nil
	case int64:
		return TypeInt64, 0, nil
	case float64:
		return TypeFloat64, 0, nil
	case []uint8:
		return TypeArray, TypeUint8, nil
	case []int8:
		return TypeArray, TypeInt8, nil
	case []uint16:
		return TypeArray, TypeUint16, nil
	case []int16:
		return TypeArray, TypeInt16, nil
	case []uint32:
		return TypeArray, TypeUint32, nil
	case []int32:
		return TypeArray, TypeInt32, nil
	case []float32:
		return TypeArray, TypeFloat32, nil
	case []bool:
		return TypeArray, TypeBool, nil
	case []string:
		return TypeArray, TypeString, nil
	case []uint64:
		return TypeArray, TypeUint64, nil
	case []int64:
		return TypeArray, TypeInt64, nil
	case []float64:
		return TypeArray, TypeFloat64, nil
	}
	return 0, 0, fmt.Errorf("metadata value of Go type %T is not a GGUF type", v)
}
