package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/memfit/memfit/safetensors"
)

// Writer streams a GGUF file: NewWriter writes the header (metadata and tensor infos, with the data offsets it
// computes), then WriteTensor writes each tensor's values in the order of the infos, converted chunk by chunk,
// so the file never exists in memory whole.
type Writer struct {
	w     io.Writer
	infos []TensorInfo
	align uint64
	next  int
	pos   uint64 // bytes of the data section written
	buf   []byte
}

// NewWriter writes the header of a GGUF v3 file with the metadata meta and the tensors infos (their Offset is
// computed here) to w. general.alignment, when meta has it, must be a uint32 power of two.
func NewWriter(w io.Writer, meta []KV, infos []TensorInfo) (*Writer, error) {
	align := uint64(DefaultAlignment)
	seen := map[string]bool{}
	for _, kv := range meta {
		if seen[kv.Key] {
			return nil, fmt.Errorf("metadata key %q given twice", kv.Key)
		}
		seen[kv.Key] = true
		if kv.Key == KeyAlignment {
			a, ok := kv.Value.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return nil, fmt.Errorf("%s must be a uint32 power of two, got %v", KeyAlignment, kv.Value)
			}
			align = uint64(a)
		}
	}
	gw := &Writer{w: w, align: align, infos: append([]TensorInfo(nil), infos...)}
	names := map[string]bool{}
	var off uint64
	for i := range gw.infos {
		ti := &gw.infos[i]
		if names[ti.Name] {
			return nil, fmt.Errorf("tensor %q given twice", ti.Name)
		}
		names[ti.Name] = true
		n, err := ti.Bytes()
		if err != nil {
			return nil, err
		}
		ti.Offset = off
		off += pad(n, align)
	}
	h := &header{}
	h.raw([]byte(Magic))
	h.u32(Version)
	h.u64(uint64(len(gw.infos)))
	h.u64(uint64(len(meta)))
	for _, kv := range meta {
		if err := h.kv(kv); err != nil {
			return nil, err
		}
	}
	for _, ti := range gw.infos {
		h.str(ti.Name)
		h.u32(uint32(len(ti.Dims)))
		for _, d := range ti.Dims {
			h.u64(d)
		}
		h.u32(uint32(ti.Type))
		h.u64(ti.Offset)
	}
	h.b = append(h.b, make([]byte, pad(uint64(len(h.b)), align)-uint64(len(h.b)))...)
	if _, err := w.Write(h.b); err != nil {
		return nil, err
	}
	return gw, nil
}

// FileSize returns the size of the GGUF file WriteFile (or NewWriter and WriteTensor) writes with the metadata
// meta and the tensors infos: the header (metadata, vocabulary included, and tensor infos, padded to the
// alignment) and every tensor's data, each padded to the alignment.
func FileSize(meta []KV, infos []TensorInfo) (uint64, error) {
	var head countingWriter
	gw, err := NewWriter(&head, meta, infos)
	if err != nil {
		return 0, err
	}
	size := head.n
	for _, ti := range gw.infos {
		n, err := ti.Bytes()
		if err != nil {
			return 0, err
		}
		size += pad(n, gw.align)
	}
	return size, nil
}

// countingWriter counts the bytes written to it.
type countingWriter struct{ n uint64 }

func (c *countingWriter) Write(b []byte) (int, error) {
	c.n += uint64(len(b))
	return len(b), nil
}

// Infos returns the tensor infos with their offsets.
func (gw *Writer) Infos() []TensorInfo { return gw.infos }

// chunk is how many values WriteTensor converts at a time (a multiple of QK8_0).
const chunk = 64 * 1024

// WriteTensor writes the values x of the tensor name, which must be the next of the infos, in its type.
func (gw *Writer) WriteTensor(name string, x []float32) error {
	if gw.next >= len(gw.infos) {
		return fmt.Errorf("tensor %q: all %d tensors are written", name, len(gw.infos))
	}
	ti := gw.infos[gw.next]
	if ti.Name != name {
		return fmt.Errorf("tensor %q written where %q comes next", name, ti.Name)
	}
	if uint64(len(x)) != ti.Elements() {
		return fmt.Errorf("tensor %s: %d values for dimensions %v", name, len(x), ti.Dims)
	}
	if ti.Offset != gw.pos {
		return fmt.Errorf("tensor %s: internal offset mismatch", name)
	}
	for i := 0; i < len(x); i += chunk {
		var err error
		gw.buf, err = Encode(gw.buf[:0], ti.Type, x[i:min(len(x), i+chunk)])
		if err != nil {
			return fmt.Errorf("tensor %s: %w", name, err)
		}
		if _, err := gw.w.Write(gw.buf); err != nil {
			return err
		}
		gw.pos += uint64(len(gw.buf))
	}
	if p := pad(gw.pos, gw.align) - gw.pos; p > 0 {
		if _, err := gw.w.Write(make([]byte, p)); err != nil {
			return err
		}
		gw.pos += p
	}
	gw.next++
	return nil
}

// Close checks that every tensor was written.
func (gw *Writer) Close() error {
	if gw.next != len(gw.infos) {
		return fmt.Errorf("only %d of %d tensors written (next: %s)", gw.next, len(gw.infos), gw.infos[gw.next].Name)
	}
	return nil
}

// Tensor is one tensor to write with WriteFile: its info (without offset) and a function giving its values,
// called when the tensor's turn comes (so only one converted tensor is alive at a time).
type Tensor struct {
	Info   TensorInfo
	Values func() ([]float32, error)
}

// WriteFile writes a GGUF file at path atomically (a temporary file beside it, renamed when complete).
func WriteFile(path string, meta []KV, ts []Tensor) error {
	infos := make([]TensorInfo, len(ts))
	for i, t := range ts {
		infos[i] = t.Info
	}
	return safetensors.WriteAtomic(path, func(w *bufio.Writer) error {
		gw, err := NewWriter(w, meta, infos)
		if err != nil {
			return err
		}
		for _, t := range ts {
			x, err := t.Values()
			if err != nil {
				return fmt.Errorf("tensor %s: %w", t.Info.Name, err)
			}
			if err := gw.WriteTensor(t.Info.Name, x); err != nil {
				return err
			}
		}
		return gw.Close()
	})
}

func pad(n, align uint64) uint64 { return (n + align - 1) / align * align }

// header accumulates the little-endian bytes of a GGUF header.
type header struct{ b []byte }

func (h *header) raw(b []byte) { h.b = append(h.b, b...) }
func (h *header) u32(v uint32) { h.b = binary.LittleEndian.AppendUint32(h.b, v) }
func (h *header) u64(v uint64) { h.b = binary.LittleEndian.AppendUint64(h.b, v) }
func (h *header) str(s string) { h.u64(uint64(len(s))); h.raw([]byte(s)) }

func (h *header) kv(kv KV) error {
	t, elem, err := valueType(kv.Value)
	if err != nil {
		return fmt.Errorf("metadata %s: %w", kv.Key, err)
	}
	h.str(kv.Key)
	h.u32(uint32(t))
	if t != TypeArray {
		h.scalar(kv.Value)
		return nil
	}
	h.u32(uint32(elem))
	switch a := kv.Value.(type) {
	case []uint8:
		h.u64(uint64(len(a)))
		h.raw(a)
	case []int8:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []uint16:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []int16:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []uint32:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []int32:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []float32:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []bool:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []string:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.str(v)
		}
	case []uint64:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []int64:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	case []float64:
		h.u64(uint64(len(a)))
		for _, v := range a {
			h.scalar(v)
		}
	}
	return nil
}

func (h *header) scalar(v any) {
	switch x := v.(type) {
	case uint8:
		h.b = append(h.b, x)
	case int8:
		h.b = append(h.b, byte(x))
	case uint16:
		h.b = binary.LittleEndian.AppendUint16(h.b, x)
	case int16:
		h.b = binary.LittleEndian.AppendUint16(h.b, uint16(x))
	case uint32:
		h.u32(x)
	case int32:
		h.u32(uint32(x))
	case float32:
		h.u32(math.Float32bits(x))
	case bool:
		if x {
			h.b = append(h.b, 1)
		} else {
			h.b = append(h.b, 0)
		}
	case string:
		h.str(x)
	case uint64:
		h.u64(x)
	case int64:
		h.u64(uint64(x))
	case float64:
		h.u64(math.Float64bits(x))
	}
}
