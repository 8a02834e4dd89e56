package safetensors_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/safetensors"
)

func sample() map[string]safetensors.Entry {
	f32 := make([]byte, 4*6)
	for i := 0; i < 6; i++ {
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(float32(i)-2.5))
	}
	return map[string]safetensors.Entry{
		"b.weight":  {DType: safetensors.F32, Shape: []int{2, 3}, Data: f32},
		"a.bias":    {DType: safetensors.BF16, Shape: []int{3}, Data: []byte{0x80, 0x3f, 0x00, 0xc0, 0x00, 0x00}},
		"c.ids":     {DType: safetensors.I64, Shape: []int{2}, Data: make([]byte, 16)},
		"d.flag":    {DType: safetensors.BOOL, Shape: []int{1}, Data: []byte{1}},
		"e.empty":   {DType: safetensors.F32, Shape: []int{0, 4}, Data: nil},
		"f.scalar":  {DType: safetensors.I8, Shape: []int{}, Data: []byte{0xfe}},
		"g.half":    {DType: safetensors.F16, Shape: []int{2}, Data: []byte{0x00, 0x3c, 0x00, 0xc0}},
		"h.u8":      {DType: safetensors.U8, Shape: []int{3}, Data: []byte{1, 2, 255}},
		"i.i32":     {DType: safetensors.I32, Shape: []int{1}, Data: []byte{1, 0, 0, 0x80}},
		"j.i16":     {DType: safetensors.I16, Shape: []int{1}, Data: []byte{1, 0x80}},
		"k.float64": {DType: safetensors.F64, Shape: []int{1}, Data: make([]byte, 8)},
	}
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	entries := sample()
	if err := safetensors.Write(path, entries, map[string]string{"note": "memfit"}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := f.Metadata(); got["format"] != "pt" || got["note"] != "memfit" {
		t.Errorf("metadata %v", got)
	}
	if len(f.Names()) != len(entries) {
		t.Fatalf("names %v", f.Names())
	}
	for name, e := range entries {
		raw, err := f.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := f.Info(name)
		if !bytes.Equal(raw, e.Data) || info.DType != e.DType || len(info.Shape) != len(e.Shape) {
			t.Errorf("%s: read %s %v %x, wrote %s %v %x", name, info.DType, info.Shape, raw, e.DType, e.Shape, e.Data)
		}
		tt, err := f.Tensor(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(tensorBytes(tt), e.Data) {
			t.Errorf("%s: tensor bytes %x, want %x", name, tensorBytes(tt), e.Data)
		}
	}
	// Write the tensors back out and compare the whole file byte for byte.
	ts := map[string]*tensors.Tensor{}
	for _, n := range f.Names() {
		ts[n], _ = f.Tensor(n)
	}
	path2 := filepath.Join(dir, "y.safetensors")
	if err := safetensors.WriteTensors(path2, ts, "", map[string]string{"note": "memfit"}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(path2)
	if !bytes.Equal(a, b) {
		t.Error("load -> write gives a different file")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Raw("b.weight"); err == nil {
		t.Error("Raw after Close succeeded")
	}
}

// TestGoldenFilesByteIdentical: reading the transformers-written golden checkpoints and writing their tensors
// back reproduces the files byte for byte (same header text and padding, same data).
func TestGoldenFilesByteIdentical(t *testing.T) {
	dir := filepath.Join(golden.SharedDir(t), "golden")
	for _, rel := range []string{"llama_a/model.safetensors", "llama_a/model-bf16.safetensors", "llama_c/model.safetensors", "vit_a/model.safetensors"} {
		path := filepath.Join(dir, rel)
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		ts := map[string]*tensors.Tensor{}
		for _, n := range f.Names() {
			if ts[n], err = f.Tensor(n); err != nil {
				t.Fatal(err)
			}
		}
		meta := map[string]string{}
		for k, v := range f.Metadata() {
			if k != "format" {
				meta[k] = v
			}
		}
		f.Close()
		out := filepath.Join(t.TempDir(), "out.safetensors")
		if err := safetensors.WriteTensors(out, ts, "", meta); err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(path)
		got, _ := os.ReadFile(out)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: rewritten file differs (%d vs %d bytes)", rel, len(got), len(want))
		}
	}
}

// TestBF16GoldenConversion: the BF16 golden file's tensors widen exactly to the F32 file's values rounded to
// bfloat16, and TensorAs(BFloat16) of the F32 file reproduces the BF16 file's bytes.
func TestBF16GoldenConversion(t *testing.T) {
	dir := filepath.Join(golden.SharedDir(t), "golden", "llama_a")
	f32, err := safetensors.OpenCheckpoint(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f32.Close()
	bf, err := safetensors.OpenCheckpoint(filepath.Join(dir, "model-bf16.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer bf.Close()
	for _, n := range f32.Names() {
		conv, err := f32.TensorAs(n, dtypes.BFloat16)
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := bf.Tensor(n)
		var a, b []byte
		_ = conv.ConstBytes(func(x []byte) { a = append([]byte(nil), x...) })
		_ = stored.ConstBytes(func(x []byte) { b = append([]byte(nil), x...) })
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: our bfloat16 rounding differs from the golden file", n)
		}
	}
}

func TestSharded(t *testing.T) {
	dir := t.TempDir()
	entries := sample()
	files, err := safetensors.WriteSharded(dir, entries, nil, 20)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 || filepath.Base(files[len(files)-1]) != safetensors.IndexFile {
		t.Fatalf("files %v", files)
	}
	if !strings.HasSuffix(files[0], "model-00001-of-0000"+string(rune('0'+len(files)-1))+".safetensors") {
		t.Errorf("first shard named %s", files[0])
	}
	c, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, e := range entries {
		tt, err := c.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tensorBytes(tt), e.Data) {
			t.Errorf("%s differs after a sharded round trip", name)
		}
	}
	// One file when everything fits.
	dir2 := t.TempDir()
	if files, _ := safetensors.WriteSharded(dir2, entries, nil, 1<<20); len(files) != 1 || filepath.Base(files[0]) != safetensors.SingleFile {
		t.Errorf("unsharded write gave %v", files)
	}
	// An index that lists a tensor its shard lacks, and a shard with an unlisted tensor.
	idx := filepath.Join(dir, safetensors.IndexFile)
	data, _ := os.ReadFile(idx)
	os.WriteFile(idx, bytes.Replace(data, []byte(`"a.bias"`), []byte(`"zz.missing"`), 1), 0o644)
	if _, err := safetensors.OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), "zz.missing") {
		t.Errorf("broken index: %v", err)
	}
}

func TestConversions(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		bf16 uint16
		f16  uint16
	}{
		{1, 0x3f80, 0x3c00}, {-2, 0xc000, 0xc000}, {0, 0, 0}, {float32(math.Inf(1)), 0x7f80, 0x7c00},
		{65504, 0x4780, 0x7bff}, {65520, 0x4780, 0x7c00}, // f16 max, and the first value rounding to f16 inf
		{5.9604645e-08, 0x3380, 0x0001}, // smallest f16 subnormal
		{1.00390625, 0x3f80, 0x3c04},    // 1 + 2^-8: bf16 tie rounds to even (down)
		{1.01171875, 0x3f82, 0x3c0c},    // 1 + 3*2^-8: bf16 tie rounds to even (up)
		{6.1035156e-05, 0x3880, 0x0400}, // smallest f16 normal
	} {
		if got := safetensors.F32ToBF16(tc.f); got != tc.bf16 {
			t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", tc.f, got, tc.bf16)
		}
		if got := safetensors.F32ToF16(tc.f); got != tc.f16 {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.f, got, tc.f16)
		}
	}
	// Every finite half converts to float32 and back unchanged; NaN stays NaN.
	for h := 0; h < 1<<16; h++ {
		f := safetensors.F16ToF32(uint16(h))
		if f != f {
			if back := safetensors.F32ToF16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back := safetensors.F32ToF16(f); back != uint16(h) {
			t.Fatalf("half %#04x -> %g -> %#04x", h, f, back)
		}
		if back := safetensors.F32ToBF16(safetensors.BF16ToF32(uint16(h))); back != uint16(h) && safetensors.BF16ToF32(uint16(h)) == safetensors.BF16ToF32(uint16(h)) {
			t.Fatalf("bfloat16 %#04x did not round-trip: %#04x", h, back)
		}
	}
	if f := safetensors.F32ToBF16(float32(math.NaN())); safetensors.BF16ToF32(f) == safetensors.BF16ToF32(f) {
		t.Error("NaN rounded to a number")
	}
}

// tensorBytes returns a copy of a tensor's bytes (nil for an empty tensor, whose bytes GoMLX cannot take).
func tensorBytes(t *tensors.Tensor) []byte {
	if t.Shape().Size() == 0 {
		return nil
	}
	var b []byte
	_ = t.ConstBytes(func(x []byte) { b = append([]byte(nil), x...) })
	return b
}

// TestWriteAtomicNamesTheFolder (ro01): a folder that takes no new file was reported as `open
// DIR/.x.gguf.tmp-2781892576: permission denied`, a hidden temporary file the user never named. Now the error
// names the folder and the file to write; a failing write names the file, not its temporary copy.
func TestWriteAtomicNamesTheFolder(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{filepath.Join(notDir, "x.gguf"): "cannot write in " + notDir + " (not a directory): writing " + filepath.Join(notDir, "x.gguf")}
	if os.Geteuid() != 0 { // root writes into read-only folders
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o555); err != nil {
			t.Fatal(err)
		}
		cases[filepath.Join(ro, "x.gguf")] = "cannot write in " + ro + " (permission denied)"
	}
	for path, want := range cases {
		err := safetensors.WriteAtomic(path, func(w *bufio.Writer) error { _, err := w.WriteString("x"); return err })
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), ".tmp-") {
			t.Errorf("%s: %v, want %q", path, err, want)
		}
	}
	target := filepath.Join(dir, "y.bin")
	err := safetensors.WriteAtomic(target, func(w *bufio.Writer) error {
		w.Flush()
		return &fs.PathError{Op: "write", Path: tmpOf(t, dir), Err: syscall.ENOSPC} // as a full disk reports it
	})
	if err == nil || err.Error() != "writing "+target+": no space left on device" {
		t.Errorf("a full disk: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".y.bin.tmp-*")); len(m) != 0 {
		t.Errorf("left behind: %v", m)
	}
}

// tmpOf returns the temporary file WriteAtomic is writing in dir.
func tmpOf(t *testing.T, dir string) string {
	m, _ := filepath.Glob(filepath.Join(dir, ".*.tmp-*"))
	if len(m) != 1 {
		t.Fatalf("temporary files %v", m)
	}
	return m[0]
}
