package gguf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func sampleFile(t testing.TB) ([]byte, []KV, map[string][]float32) {
	t.Helper()
	meta := []KV{
		{"general.architecture", "llama"}, {"general.alignment", uint32(64)}, {"u8", uint8(7)}, {"i8", int8(-3)},
		{"u16", uint16(65535)}, {"i16", int16(-300)}, {"i32", int32(-70000)}, {"f32", float32(1.5)}, {"b", true},
		{"u64", uint64(1) << 40}, {"i64", int64(-1) << 40}, {"f64", 1e-300},
		{"tokens", []string{"a", "", "ß ∑"}}, {"scores", []float32{0, -1, -2.5}}, {"types", []int32{1, 3, 6}},
		{"flags", []bool{true, false}}, {"bytes", []uint8{1, 2, 3}},
	}
	r := rand.New(rand.NewPCG(1, 2))
	vals := map[string][]float32{}
	var ts []Tensor
	for _, s := range []struct {
		name string
		dims []uint64
		typ  TensorType
	}{{"a", []uint64{5}, F32}, {"b", []uint64{64, 3}, F16}, {"c", []uint64{32, 4}, Q8_0}, {"d", []uint64{3, 2, 2}, F32}, {"e", []uint64{7}, BF16}} {
		x := make([]float32, TensorInfo{Dims: s.dims}.Elements())
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		vals[s.name] = x
		ts = append(ts, Tensor{Info: TensorInfo{Name: s.name, Dims: s.dims, Type: s.typ}, Values: func() ([]float32, error) { return x, nil }})
	}
	var buf bytes.Buffer
	infos := make([]TensorInfo, len(ts))
	for i, x := range ts {
		infos[i] = x.Info
	}
	w, err := NewWriter(&buf, meta, infos)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ts {
		v, _ := x.Values()
		if err := w.WriteTensor(x.Info.Name, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), meta, vals
}

// TestRoundTrip writes every metadata type and the three tensor types, then reads them back: metadata equal,
// f32 exact, f16 within half an f16 ulp, q8_0 within half a quantisation step; offsets aligned to 64.
func TestRoundTrip(t *testing.T) {
	data, meta, vals := sampleFile(t)
	f, err := Parse(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 3 || f.Alignment != 64 || f.DataOffset%64 != 0 {
		t.Fatalf("version %d alignment %d data offset %d", f.Version, f.Alignment, f.DataOffset)
	}
	if !reflect.DeepEqual(f.Meta, meta) {
		t.Fatalf("metadata\n got %v\nwant %v", f.Meta, meta)
	}
	if s, _, _ := f.String("general.architecture"); s != "llama" {
		t.Fatalf("architecture %q", s)
	}
	if n, _, _ := f.Uint("u16"); n != 65535 {
		t.Fatalf("u16 %d", n)
	}
	for _, ti := range f.Tensors {
		if ti.Offset%64 != 0 {
			t.Fatalf("%s offset %d", ti.Name, ti.Offset)
		}
		got, err := f.Float32s(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		want := vals[ti.Name]
		for i := range want {
			tol := 0.0
			switch ti.Type {
			case F16:
				tol = math.Abs(float64(want[i])) * 0x1p-11
			case BF16:
				tol = math.Abs(float64(want[i])) * 0x1p-8
			case Q8_0:
				blk := want[i/32*32 : i/32*32+32]
				var amax float64
				for _, v := range blk {
					amax = max(amax, math.Abs(float64(v)))
				}
				tol = amax/127/2*1.01 + amax*0x1p-11
			}
			if d := math.Abs(float64(got[i] - want[i])); d > tol {
				t.Fatalf("%s[%d] %s: got %g want %g (tolerance %g)", ti.Name, i, ti.Type, got[i], want[i], tol)
			}
		}
	}
}

// TestQ8Block checks one q8_0 block byte for byte against llama.cpp's reference rule: d = max|x|/127 as f16,
// q = round(x * (1/d)) with halves away from zero (2.5 steps -> 3, -2.5 -> -3), and an all-zero block.
func TestQ8Block(t *testing.T) {
	x := make([]float32, 32)
	x[0] = 127 // d = 1
	x[1], x[2], x[3], x[4] = 2.5, -2.5, 0.49, -126.6
	b := appendQ8Block(nil, x)
	if h := binary.LittleEndian.Uint16(b); h != 0x3c00 { // 1.0 in f16
		t.Fatalf("scale %#x, want 0x3c00", h)
	}
	want := []int8{127, 3, -3, 0, -127}
	for i, w := range want {
		if got := int8(b[2+i]); got != w {
			t.Fatalf("q[%d] = %d, want %d", i, got, w)
		}
	}
	z := appendQ8Block(nil, make([]float32, 32))
	if !bytes.Equal(z, make([]byte, 34)) {
		t.Fatalf("zero block %v", z)
	}
}

// TestBadFiles: every truncation of a valid file, wrong magic, huge counts, an unknown tensor type and a tensor
// past the end are each one error.
func TestBadFiles(t *testing.T) {
	data, _, _ := sampleFile(t)
	// Every byte up to the end of the last tensor's data is needed (the padding after it is not).
	g := mustParse(t, data)
	end := 0
	for _, ti := range g.Tensors {
		n, _ := ti.Bytes()
		end = max(end, int(g.DataOffset+ti.Offset+n))
	}
	for n := 0; n < end; n++ {
		if _, err := Parse(bytes.NewReader(data[:n]), int64(n)); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", n, len(data))
		}
	}
	huge := append([]byte(nil), data...)
	binary.LittleEndian.PutUint64(huge[16:], math.MaxUint64) // metadata count
	_, err := Parse(bytes.NewReader(huge), int64(len(huge)))
	if err == nil || !strings.Contains(err.Error(), "more than the file") {
		t.Fatalf("huge count: %v", err)
	}
	bad := append([]byte("GGML"), data[4:]...)
	if _, err := Parse(bytes.NewReader(bad), int64(len(bad))); err == nil || !strings.Contains(err.Error(), "not a GGUF file") {
		t.Fatalf("bad magic: %v", err)
	}
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "missing.gguf")); err == nil {
		t.Fatal("missing file opened")
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "folder") {
		t.Fatalf("folder: %v", err)
	}
}

func mustParse(t *testing.T, data []byte) *File {
	f, err := Parse(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestWriteFileAtomic: WriteFile leaves the complete file or nothing (a failing tensor leaves no file behind).
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.gguf")
	ts := []Tensor{{Info: TensorInfo{Name: "x", Dims: []uint64{32}, Type: Q8_0}, Values: func() ([]float32, error) { return make([]float32, 31), nil }}}
	if err := WriteFile(p, nil, ts); err == nil {
		t.Fatal("wrong value count accepted")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 0 {
		t.Fatalf("left behind: %v", m)
	}
	ts[0].Values = func() ([]float32, error) { return make([]float32, 32), nil }
	if err := WriteFile(p, []KV{{"k", "v"}}, ts); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Tensors) != 1 || f.Tensors[0].Type != Q8_0 {
		t.Fatalf("%+v", f.Tensors)
	}
}

// FuzzParse: any bytes give a File or an error, never a panic or an allocation sized by a declared count.
func FuzzParse(f *testing.F) {
	data, _, _ := sampleFile(f)
	f.Add(data)
	f.Add(data[:40])
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Parse(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		for _, ti := range g.Tensors {
			if _, err := g.Float32s(ti.Name); err != nil {
				t.Fatalf("%s: header accepted but data unreadable: %v", ti.Name, err)
			}
		}
	})
}

// TestFileSizeIsExact (df05): the export's free-space check counted the tensors only (1.283 MiB for llama-tiny
// q8_0, a file of 1.408 MiB), so with space between the two the write failed on a full disk. FileSize is the
// whole file, metadata, vocabulary and alignment padding included, to the byte.
func TestFileSizeIsExact(t *testing.T) {
	vocab := make([]string, 32000)
	for i := range vocab {
		vocab[i] = fmt.Sprintf("tok%d", i)
	}
	meta := []KV{{"general.architecture", "llama"}, {"tokenizer.ggml.tokens", vocab}, {"tokenizer.ggml.scores", make([]float32, len(vocab))}}
	var ts []Tensor
	var infos []TensorInfo
	var tensors uint64
	for _, s := range []struct {
		name string
		dims []uint64
		typ  TensorType
	}{{"a", []uint64{5}, F32}, {"b", []uint64{64, 3}, F16}, {"c", []uint64{32, 40}, Q8_0}, {"d", []uint64{7}, BF16}} {
		info := TensorInfo{Name: s.name, Dims: s.dims, Type: s.typ}
		n := info.Elements()
		ts = append(ts, Tensor{Info: info, Values: func() ([]float32, error) { return make([]float32, n), nil }})
		infos = append(infos, info)
		b, _ := info.Bytes()
		tensors += b
	}
	p := filepath.Join(t.TempDir(), "v.gguf")
	if err := WriteFile(p, meta, ts); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	size, err := FileSize(meta, infos)
	if err != nil || size != uint64(st.Size()) {
		t.Errorf("FileSize %d (%v), the file has %d bytes", size, err, st.Size())
	}
	if size < tensors+32000*8 {
		t.Errorf("FileSize %d does not count the vocabulary (tensors %d)", size, tensors)
	}
}
