package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/memfit/memfit/internal/readfile"
)

// Limits on what a header may declare, beyond the file's size.
const (
	maxDims      = 4       // ggml's GGML_MAX_DIMS
	maxKeyLen    = 1 << 16 // bytes of a key or a tensor name
	maxStringLen = 1 << 30 // bytes of a string value
)

// File is a GGUF file opened for reading: its metadata and tensor infos; tensor data are read on demand.
type File struct {
	// Version is the format version (2 or 3).
	Version uint32
	// Meta is the metadata in file order.
	Meta []KV
	// Tensors are the tensor infos in file order.
	Tensors []TensorInfo
	// Alignment is general.alignment (DefaultAlignment when absent); DataOffset where the data section starts.
	Alignment, DataOffset uint64

	r      io.ReaderAt
	size   int64
	closer io.Closer
	path   string
	meta   map[string]int
	byName map[string]int
}

// Open reads the header of the GGUF file at path.
func Open(path string) (*File, error) {
	f, err := readfile.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.IsDir() {
		f.Close()
		return nil, fmt.Errorf("%s is a folder, not a GGUF file", path)
	}
	g, err := Parse(f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	g.closer, g.path = f, path
	return g, nil
}

// Close closes the file.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}

// Parse reads a GGUF header from r, a file of size bytes. Every count and length is checked against what the
// file can hold before anything is allocated for it; tensor data must lie inside the file.
func Parse(r io.ReaderAt, size int64) (*File, error) {
	c := &cursor{br: bufio.NewReaderSize(io.NewSectionReader(r, 0, size), 1<<16), size: size}
	magic := c.bytes(4)
	if c.err != nil || string(magic) != Magic {
		if c.err == nil {
			c.err = fmt.Errorf("not a GGUF file (it starts with %q, not %q)", magic, Magic)
		}
		return nil, c.fail("the magic")
	}
	f := &File{r: r, size: size, Alignment: DefaultAlignment, meta: map[string]int{}, byName: map[string]int{}}
	f.Version = c.u32()
	if c.err == nil && f.Version != 2 && f.Version != 3 {
		return nil, fmt.Errorf("GGUF version %d is not supported (2 and 3 are)", f.Version)
	}
	nTensors, nKV := c.u64(), c.u64()
	if c.err != nil {
		return nil, c.fail("the header")
	}
	// The smallest key/value is 8 (key length) + 4 (type) + 1 bytes; the smallest tensor info 8 + 4 + 4 + 8.
	if rest := uint64(c.remaining()); nKV > rest/13 || nTensors > rest/24 {
		return nil, fmt.Errorf("the header declares %d metadata keys and %d tensors, more than the file's %d bytes can hold (truncated or not a GGUF file)", nKV, nTensors, size)
	}
	for i := range nKV {
		key := c.str(maxKeyLen)
		t := ValueType(c.u32())
		v := c.value(t, true)
		if c.err != nil {
			return nil, c.fail(fmt.Sprintf("metadata key %d", i))
		}
		if _, dup := f.meta[key]; dup {
			return nil, fmt.Errorf("metadata key %q appears twice", key)
		}
		f.meta[key] = len(f.Meta)
		f.Meta = append(f.Meta, KV{Key: key, Value: v})
	}
	if i, ok := f.meta[KeyAlignment]; ok {
		a, isU32 := f.Meta[i].Value.(uint32)
		if !isU32 || a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("%s is %v: want a uint32 power of two", KeyAlignment, f.Meta[i].Value)
		}
		f.Alignment = uint64(a)
	}
	for i := range nTensors {
		ti := TensorInfo{Name: c.str(maxKeyLen)}
		nd := c.u32()
		if c.err == nil && nd > maxDims {
			return nil, fmt.Errorf("tensor %q has %d dimensions (at most %d)", ti.Name, nd, maxDims)
		}
		for range nd {
			ti.Dims = append(ti.Dims, c.u64())
		}
		ti.Type = TensorType(c.u32())
		ti.Offset = c.u64()
		if c.err != nil {
			return nil, c.fail(fmt.Sprintf("tensor info %d", i))
		}
		if _, dup := f.byName[ti.Name]; dup {
			return nil, fmt.Errorf("tensor %q appears twice", ti.Name)
		}
		f.byName[ti.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}
	f.DataOffset = pad(uint64(c.pos), f.Alignment)
	for _, ti := range f.Tensors {
		n, err := ti.Bytes()
		if err != nil {
			return nil, err
		}
		if ti.Offset%f.Alignment != 0 {
			return nil, fmt.Errorf("tensor %s: data offset %d is not a multiple of the alignment %d", ti.Name, ti.Offset, f.Alignment)
		}
		if ti.Offset > uint64(size) || n > uint64(size) || f.DataOffset+ti.Offset+n > uint64(size) {
			return nil, fmt.Errorf("tensor %s: its %d bytes at offset %d lie past the end of the file (%d bytes): the file is truncated", ti.Name, n, ti.Offset, size)
		}
	}
	return f, nil
}

// Value returns the metadata value of key.
func (f *File) Value(key string) (any, bool) {
	i, ok := f.meta[key]
	if !ok {
		return nil, false
	}
	return f.Meta[i].Value, true
}

// String returns the string value of key ("", false when absent; an error when of another type).
func (f *File) String(key string) (string, bool, error) {
	v, ok := f.Value(key)
	if !ok {
		return "", false, nil
	}
	s, isStr := v.(string)
	if !isStr {
		return "", false, fmt.Errorf("metadata %s is %T, want a string", key, v)
	}
	return s, true, nil
}

// Uint returns the value of key, an unsigned or non-negative signed integer of any width.
func (f *File) Uint(key string) (uint64, bool, error) {
	v, ok := f.Value(key)
	if !ok {
		return 0, false, nil
	}
	switch x := v.(type) {
	case uint8:
		return uint64(x), true, nil
	case uint16:
		return uint64(x), true, nil
	case uint32:
		return uint64(x), true, nil
	case uint64:
		return x, true, nil
	case int8:
		if x >= 0 {
			return uint64(x), true, nil
		}
	case int16:
		if x >= 0 {
			return uint64(x), true, nil
		}
	case int32:
		if x >= 0 {
			return uint64(x), true, nil
		}
	case int64:
		if x >= 0 {
			return uint64(x), true, nil
		}
	}
	return 0, false, fmt.Errorf("metadata %s is %v (%T), want a non-negative integer", key, v, v)
}

// Float returns the value of key, a float32 or float64.
func (f *File) Float(key string) (float64, bool, error) {
	v, ok := f.Value(key)
	if !ok {
		return 0, false, nil
	}
	switch x := v.(type) {
	case float32:
		return float64(x), true, nil
	case float64:
		return x, true, nil
	}
	return 0, false, fmt.Errorf("metadata %s is %T, want a float", key, v)
}

// Bool returns the value of key, a bool.
func (f *File) Bool(key string) (bool, bool, error) {
	v, ok := f.Value(key)
	if !ok {
		return false, false, nil
	}
	b, isBool := v.(bool)
	if !isBool {
		return false, false, fmt.Errorf("metadata %s is %T, want a bool", key, v)
	}
	return b, true, nil
}

// Tensor returns the info of the tensor name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensors[i], true
}

// Float32s reads the tensor name and returns its values as float32 (f16, bf16 and q8_0 dequantised), in ggml's order
// (Dims[0] fastest).
func (f *File) Float32s(name string) ([]float32, error) {
	ti, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("no tensor %q in the GGUF file", name)
	}
	n, err := ti.Bytes()
	if err != nil {
		return nil, err
	}
	raw := make([]byte, n)
	if _, err := f.r.ReadAt(raw, int64(f.DataOffset+ti.Offset)); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	out := make([]float32, ti.Elements())
	if err := Decode(out, ti.Type, raw); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	return out, nil
}

// cursor reads little-endian values, keeping the first error and refusing to read past size.
type cursor struct {
	br   *bufio.Reader
	pos  int64
	size int64
	err  error
}

func (c *cursor) remaining() int64 { return c.size - c.pos }

func (c *cursor) fail(what string) error {
	if errors.Is(c.err, io.EOF) || errors.Is(c.err, io.ErrUnexpectedEOF) || errors.Is(c.err, errTruncated) {
		return fmt.Errorf("the file ends inside %s (at byte %d of %d): it is truncated or not a GGUF file", what, c.pos, c.size)
	}
	return fmt.Errorf("%s: %w", what, c.err)
}

var errTruncated = errors.New("truncated")

func (c *cursor) bytes(n uint64) []byte {
	if c.err != nil {
		return nil
	}
	if n > uint64(c.remaining()) {
		c.err = errTruncated
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c.br, b); err != nil {
		c.err = err
		return nil
	}
	c.pos += int64(n)
	return b
}

func (c *cursor) u8() uint8 {
	b := c.bytes(1)
	if b == nil {
		return 0
	}
	return b[0]
}

func (c *cursor) u16() uint16 {
	b := c.bytes(2)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint16(b)
}

func (c *cursor) u32() uint32 {
	b := c.bytes(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (c *cursor) u64() uint64 {
	b := c.bytes(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

func (c *cursor) str(limit uint64) string {
	n := c.u64()
	if c.err == nil && n > limit {
		c.err = fmt.Errorf("a string of %d bytes (at most %d)", n, limit)
		return ""
	}
	return string(c.bytes(n))
}

// value reads one value of type t; arrays (of scalars or strings, not of arrays) only when top.
func (c *cursor) value(t ValueType, top bool) any {
	switch t {
	case TypeUint8:
		return c.u8()
	case TypeInt8:
		return int8(c.u8())
	case TypeUint16:
		return c.u16()
	case TypeInt16:
		return int16(c.u16())
	case TypeUint32:
		return c.u32()
	case TypeInt32:
		return int32(c.u32())
	case TypeFloat32:
		return math.Float32frombits(c.u32())
	case TypeBool:
		b := c.u8()
		if c.err == nil && b > 1 {
			c.err = fmt.Errorf("a bool of value %d", b)
		}
		return b == 1
	case TypeString:
		return c.str(maxStringLen)
	case TypeUint64:
		return c.u64()
	case TypeInt64:
		return int64(c.u64())
	case TypeFloat64:
		return math.Float64frombits(c.u64())
	case TypeArray:
		if !top {
			c.err = errors.New("an array of arrays (not supported)")
			return nil
		}
		return c.array()
	}
	if c.err == nil {
		c.err = fmt.Errorf("unknown value type %d", uint32(t))
	}
	return nil
}

func (c *cursor) array() any {
	et := ValueType(c.u32())
	n := c.u64()
	if c.err != nil {
		return nil
	}
	minSize := uint64(et.size())
	if et == TypeString {
		minSize = 8
	}
	if minSize == 0 {
		c.err = fmt.Errorf("an array of value type %d (not supported)", uint32(et))
		return nil
	}
	if n > uint64(c.remaining())/minSize {
		c.err = fmt.Errorf("an array of %d values, more than the %d bytes left in the file can hold", n, c.remaining())
		return nil
	}
	switch et {
	case TypeString:
		return collect(c, n, func() string { return c.str(maxStringLen) })
	case TypeUint8:
		return c.bytes(n)
	case TypeInt8:
		return collect(c, n, func() int8 { return int8(c.u8()) })
	case TypeUint16:
		return collect(c, n, c.u16)
	case TypeInt16:
		return collect(c, n, func() int16 { return int16(c.u16()) })
	case TypeUint32:
		return collect(c, n, c.u32)
	case TypeInt32:
		return collect(c, n, func() int32 { return int32(c.u32()) })
	case TypeFloat32:
		return collect(c, n, func() float32 { return math.Float32frombits(c.u32()) })
	case TypeBool:
		return collect(c, n, func() bool { return c.value(TypeBool, false).(bool) })
	case TypeUint64:
		return collect(c, n, c.u64)
	case TypeInt64:
		return collect(c, n, func() int64 { return int64(c.u64()) })
	case TypeFloat64:
		return collect(c, n, func() float64 { return math.Float64frombits(c.u64()) })
	}
	return nil
}

func collect[T any](c *cursor, n uint64, read func() T) []T {
	out := make([]T, 0, n)
	for range n {
		v := read()
		if c.err != nil {
			return nil
		}
		out = append(out, v)
	}
	return out
}
