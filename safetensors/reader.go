package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/memfit/memfit/internal/readfile"
)

// MaxHeaderSize bounds the JSON header (safetensors itself allows 100 MB).
const MaxHeaderSize = 100 << 20

// Info describes one tensor of a file.
type Info struct {
	Name  string
	DType DType
	Shape []int
	// Begin and End are the tensor's byte range within the data section.
	Begin, End int64
}

// Bytes returns the tensor's size in bytes.
func (i Info) Bytes() int64 { return i.End - i.Begin }

// File is an open, validated safetensors file. Its tensors' raw bytes are slices of a read-only memory mapping
// that Close releases.
type File struct {
	path     string
	data     []byte // the whole mapping
	dataOff  int64  // start of the data section
	unmap    func() error
	infos    map[string]Info
	names    []string
	metadata map[string]string
}

// Open maps and validates a safetensors file.
func Open(path string) (*File, error) {
	f, err := readfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%s is a directory, not a safetensors file", path)
	}
	data, unmap, err := mapFile(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sf, err := parse(path, data)
	if err != nil {
		_ = unmap()
		return nil, err
	}
	sf.unmap = unmap
	return sf, nil
}

// Parse validates a safetensors file held in memory (data is referenced, not copied).
func Parse(name string, data []byte) (*File, error) {
	f, err := parse(name, data)
	if err != nil {
		return nil, err
	}
	f.unmap = func() error { return nil }
	return f, nil
}

type headerEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

func parse(path string, data []byte) (*File, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: not a valid safetensors file: %s", path, fmt.Sprintf(format, args...))
	}
	size := int64(len(data))
	if size < 8 {
		return nil, bad("%d bytes, shorter than the 8-byte header length", size)
	}
	n := binary.LittleEndian.Uint64(data[:8])
	if n > MaxHeaderSize {
		return nil, bad("header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	}
	if int64(n) > size-8 {
		return nil, bad("header length %d is longer than the rest of the file (%d bytes): the file is truncated or corrupt", n, size-8)
	}
	header := data[8 : 8+n]
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(header))
	if err := dec.Decode(&raw); err != nil || raw == nil {
		return nil, bad("header is not a JSON object (%v)", err)
	}
	if trailing := bytes.TrimRight(header[dec.InputOffset():], " \t\r\n\x00"); len(trailing) != 0 {
		return nil, bad("header has data after its JSON object")
	}
	f := &File{path: path, data: data, dataOff: 8 + int64(n), infos: map[string]Info{}}
	dataSize := size - f.dataOff
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &f.metadata); err != nil {
				return nil, bad("__metadata__ must map strings to strings (%v)", err)
			}
			continue
		}
		var e headerEntry
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, bad("tensor %q: %v", name, err)
		}
		dt := DType(e.DType)
		if dt.Size() == 0 {
			return nil, bad("tensor %q: unsupported dtype %q", name, e.DType)
		}
		if len(e.DataOffsets) != 2 {
			return nil, bad("tensor %q: data_offsets must have 2 entries, got %d", name, len(e.DataOffsets))
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > dataSize {
			return nil, bad("tensor %q: data_offsets [%d, %d] outside the %d-byte data section", name, begin, end, dataSize)
		}
		elems := uint64(1)
		shape := make([]int, len(e.Shape))
		for i, d := range e.Shape {
			if d < 0 || d > math.MaxInt32 {
				return nil, bad("tensor %q: dimension %d is %d", name, i, d)
			}
			hi, lo := bits.Mul64(elems, uint64(d))
			if hi != 0 || lo > math.MaxInt64 {
				return nil, bad("tensor %q: shape %v overflows", name, e.Shape)
			}
			elems = lo
			shape[i] = int(d)
		}
		hi, want := bits.Mul64(elems, uint64(dt.Size()))
		if hi != 0 || want != uint64(end-begin) {
			return nil, bad("tensor %q: %s %v needs %d bytes but data_offsets give %d", name, dt, e.Shape, want, end-begin)
		}
		f.infos[name] = Info{Name: name, DType: dt, Shape: shape, Begin: begin, End: end}
		f.names = append(f.names, name)
	}
	sort.Strings(f.names)
	// No two tensors may overlap (empty tensors take no room).
	byOffset := make([]Info, 0, len(f.infos))
	for _, info := range f.infos {
		if info.End > info.Begin {
			byOffset = append(byOffset, info)
		}
	}
	sort.Slice(byOffset, func(i, j int) bool { return byOffset[i].Begin < byOffset[j].Begin })
	for i := 1; i < len(byOffset); i++ {
		if byOffset[i].Begin < byOffset[i-1].End {
			return nil, bad("tensors %q and %q overlap", byOffset[i-1].Name, byOffset[i].Name)
		}
	}
	return f, nil
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Names returns the tensor names, sorted.
func (f *File) Names() []string { return append([]string(nil), f.names...) }

// Metadata returns the header's __metadata__ (nil when absent).
func (f *File) Metadata() map[string]string { return f.metadata }

// Info returns the description of a tensor.
func (f *File) Info(name string) (Info, bool) {
	i, ok := f.infos[name]
	return i, ok
}

// ErrClosed is returned when a closed file is read.
var ErrClosed = errors.New("safetensors: file is closed")

// Raw returns the tensor's little-endian bytes: a slice of the read-only mapping, valid until Close. Do not
// write to it.
func (f *File) Raw(name string) ([]byte, error) {
	if f.data == nil && f.unmap == nil {
		return nil, ErrClosed
	}
	info, ok := f.infos[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.path, name)
	}
	return f.data[f.dataOff+info.Begin : f.dataOff+info.End : f.dataOff+info.End], nil
}

// Tensor copies a tensor into a new GoMLX tensor of its stored dtype (F16 included: GoMLX's Float16 type holds
// it, although the pure-Go backend cannot compute with it; use TensorAs to convert).
func (f *File) Tensor(name string) (*tensors.Tensor, error) {
	info, ok := f.infos[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.path, name)
	}
	dt, err := info.DType.GoMLX()
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
	}
	raw, err := f.Raw(name)
	if err != nil {
		return nil, err
	}
	t := tensors.FromShape(shapes.Make(dt, info.Shape...))
	if len(raw) == 0 {
		return t, nil // GoMLX cannot take the bytes of an empty tensor
	}
	err = t.MutableBytes(func(b []byte) { copy(b, raw) })
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
	}
	return t, nil
}

// TensorAs copies a tensor into a new GoMLX tensor of dtype want, converting between float formats (F64, F32,
// F16, BF16 to F32; F32/F16/BF16 to BF16 with round-to-nearest-even; any dtype to itself).
func (f *File) TensorAs(name string, want dtypes.DType) (*tensors.Tensor, error) {
	info, ok := f.infos[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.path, name)
	}
	have, err := info.DType.GoMLX()
	if err == nil && have == want {
		return f.Tensor(name)
	}
	raw, err := f.Raw(name)
	if err != nil {
		return nil, err
	}
	n := int(info.Bytes()) / info.DType.Size()
	switch {
	case want == dtypes.Float32 && info.DType.IsFloat():
		out := make([]float32, n)
		toFloat32(info.DType, raw, out)
		return tensors.FromFlatDataAndDimensions(out, info.Shape...), nil
	case want == dtypes.BFloat16 && info.DType.IsFloat():
		tmp := make([]float32, n)
		toFloat32(info.DType, raw, tmp)
		t := tensors.FromShape(shapes.Make(dtypes.BFloat16, info.Shape...))
		if n == 0 {
			return t, nil
		}
		err := t.MutableBytes(func(b []byte) {
			for i, v := range tmp {
				binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(v))
			}
		})
		return t, err
	}
	return nil, fmt.Errorf("%s: tensor %q: cannot convert %s to %s", f.path, name, info.DType, want)
}

// Float32s returns a float tensor's values converted to float32.
func (f *File) Float32s(name string) ([]float32, error) {
	info, ok := f.infos[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.path, name)
	}
	if !info.DType.IsFloat() {
		return nil, fmt.Errorf("%s: tensor %q is %s, not a float", f.path, name, info.DType)
	}
	raw, err := f.Raw(name)
	if err != nil {
		return nil, err
	}
	out := make([]float32, int(info.Bytes())/info.DType.Size())
	toFloat32(info.DType, raw, out)
	return out, nil
}

// Close releases the mapping; slices returned by Raw become invalid.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	err := f.unmap()
	f.unmap, f.data = nil, nil
	return err
}
