package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"
)

// Entry is one tensor to write: its dtype, shape and little-endian bytes.
type Entry struct {
	DType DType
	Shape []int
	Data  []byte
}

// FromTensor returns the entry of a GoMLX tensor, stored in its own dtype, or converted to as when as is F16 or
// BF16 and the tensor is float32 (round to nearest even).
func FromTensor(t *tensors.Tensor, as DType) (Entry, error) {
	dt, err := FromGoMLX(t.DType())
	if err != nil {
		return Entry{}, err
	}
	e := Entry{DType: dt, Shape: append([]int(nil), t.Shape().Dimensions...)}
	if t.Shape().Size() == 0 {
		if as != "" {
			e.DType = as
		}
		return e, nil // GoMLX cannot take the bytes of an empty tensor
	}
	if as == "" || as == dt {
		err = t.ConstBytes(func(b []byte) { e.Data = append([]byte(nil), b...) })
		return e, err
	}
	if t.DType() != dtypes.Float32 || (as != BF16 && as != F16) {
		return Entry{}, fmt.Errorf("cannot store a %s tensor as %s", t.DType(), as)
	}
	e.DType = as
	err = tensors.ConstFlatData[float32](t, func(flat []float32) {
		e.Data = make([]byte, 2*len(flat))
		for i, v := range flat {
			h := F32ToBF16(v)
			if as == F16 {
				h = F32ToF16(v)
			}
			binary.LittleEndian.PutUint16(e.Data[2*i:], h)
		}
	})
	return e, err
}

func (e Entry) check(name string) error {
	if e.DType.Size() == 0 {
		return fmt.Errorf("tensor %q: unsupported dtype %q", name, e.DType)
	}
	n := 1
	for _, d := range e.Shape {
		if d < 0 {
			return fmt.Errorf("tensor %q: negative dimension in %v", name, e.Shape)
		}
		n *= d
	}
	if n*e.DType.Size() != len(e.Data) {
		return fmt.Errorf("tensor %q: %s %v needs %d bytes, got %d", name, e.DType, e.Shape, n*e.DType.Size(), len(e.Data))
	}
	return nil
}

// header builds the JSON header (names sorted, offsets contiguous in that order, __metadata__ with
// format "pt" plus metadata), padded with spaces to a multiple of 8 bytes, as the safetensors library writes it.
func header(entries map[string]Entry, metadata map[string]string) ([]byte, []string, error) {
	names := make([]string, 0, len(entries))
	for n := range entries {
		if n == "__metadata__" || n == "" {
			return nil, nil, fmt.Errorf("invalid tensor name %q", n)
		}
		if err := entries[n].check(n); err != nil {
			return nil, nil, err
		}
		names = append(names, n)
	}
	sort.Strings(names)
	meta := map[string]string{"format": "pt"}
	for k, v := range metadata {
		meta[k] = v
	}
	var sb strings.Builder
	metaJSON, _ := json.Marshal(meta)
	sb.WriteString(`{"__metadata__":`)
	sb.Write(metaJSON)
	var off int64
	for _, n := range names {
		e := entries[n]
		nameJSON, _ := json.Marshal(n)
		shape := e.Shape
		if shape == nil {
			shape = []int{}
		}
		shapeJSON, _ := json.Marshal(shape)
		end := off + int64(len(e.Data))
		fmt.Fprintf(&sb, `,%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}`, nameJSON, e.DType, shapeJSON, off, end)
		off = end
	}
	sb.WriteString("}")
	h := []byte(sb.String())
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	return h, names, nil
}

// Write writes entries to path atomically: a temporary file in the same folder is written, synced and renamed
// over path, so a crash leaves either the old file or the new one.
func Write(path string, entries map[string]Entry, metadata map[string]string) error {
	h, names, err := header(entries, metadata)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return WriteAtomic(path, func(w *bufio.Writer) error {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(h)))
		if _, err := w.Write(n[:]); err != nil {
			return err
		}
		if _, err := w.Write(h); err != nil {
			return err
		}
		for _, name := range names {
			if _, err := w.Write(entries[name].Data); err != nil {
				return err
			}
		}
		return nil
	})
}

// WriteTensors writes GoMLX tensors to path atomically, each in its own dtype (or as, for float32 tensors, when
// as is BF16 or F16).
func WriteTensors(path string, ts map[string]*tensors.Tensor, as DType, metadata map[string]string) error {
	entries := make(map[string]Entry, len(ts))
	for name, t := range ts {
		e, err := FromTensor(t, as)
		if err != nil {
			return fmt.Errorf("%s: tensor %q: %w", path, name, err)
		}
		entries[name] = e
	}
	return Write(path, entries, metadata)
}

// WriteAtomic creates path by writing a temporary file next to it with fill, syncing and renaming it over path.
// On any error the temporary file is removed and path is left as it was.
//
// Errors name path and its folder, never the hidden temporary file: a folder that takes no new file (read-only,
// not a folder) is `cannot write in DIR (permission denied): ...`, a full disk `writing PATH: no space left on
// device`.
func WriteAtomic(path string, fill func(w *bufio.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("cannot write in %s (%v): writing %s needs a folder that takes new files; choose another", dir, err, path)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			// The temporary file's name means nothing to the user: name path instead.
			var pe *fs.PathError
			if errors.As(err, &pe) && pe.Path == tmp.Name() {
				err = fmt.Errorf("writing %s: %w", path, pe.Err)
			}
		}
	}()
	w := bufio.NewWriterSize(tmp, 1<<20)
	if err = fill(w); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) && pe.Path == tmp.Name() {
			return err // named by the deferred function
		}
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err = w.Flush(); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// WriteSharded writes entries into dir as transformers' save_pretrained does: model.safetensors when they fit
// in maxShardBytes, otherwise model-00001-of-0000N.safetensors shards (tensors in name order, a new shard when
// the next tensor would overflow the current one) plus model.safetensors.index.json, written last. Every file
// is written atomically. It returns the files written.
func WriteSharded(dir string, entries map[string]Entry, metadata map[string]string, maxShardBytes int64) ([]string, error) {
	names := make([]string, 0, len(entries))
	var total int64
	for n, e := range entries {
		names = append(names, n)
		total += int64(len(e.Data))
	}
	sort.Strings(names)
	if maxShardBytes <= 0 || total <= maxShardBytes {
		p := filepath.Join(dir, SingleFile)
		return []string{p}, Write(p, entries, metadata)
	}
	var shards []map[string]Entry
	var cur map[string]Entry
	var curSize int64
	for _, n := range names {
		size := int64(len(entries[n].Data))
		if cur == nil || (curSize > 0 && curSize+size > maxShardBytes) {
			cur = map[string]Entry{}
			shards = append(shards, cur)
			curSize = 0
		}
		cur[n] = entries[n]
		curSize += size
	}
	idx := Index{Metadata: map[string]any{"total_size": total}, WeightMap: map[string]string{}}
	var written []string
	for i, shard := range shards {
		file := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		p := filepath.Join(dir, file)
		if err := Write(p, shard, metadata); err != nil {
			return written, err
		}
		written = append(written, p)
		for n := range shard {
			idx.WeightMap[n] = file
		}
	}
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return written, err
	}
	p := filepath.Join(dir, IndexFile)
	err = WriteAtomic(p, func(w *bufio.Writer) error {
		_, err := w.Write(append(data, '\n'))
		return err
	})
	return append(written, p), err
}
