package data

import (
	"archive/tar"
	"bytes"
	"errors"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/internal/golden"
)

func pngBytes(t *testing.T, w, h int, v uint8) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.RGBA{R: v, G: uint8(x * 10), B: uint8(y * 10), A: 255})
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// writeTree writes root/<class>/<i>.png for two classes and returns the files' bytes by relative path.
func writeTree(t *testing.T, root string) map[string][]byte {
	files := map[string][]byte{}
	for c, class := range []string{"cat", "ant"} {
		for i := 0; i < 3; i++ {
			rel := filepath.Join(class, string(rune('a'+i))+".png")
			b := pngBytes(t, 8, 6, uint8(100*c+i))
			os.MkdirAll(filepath.Join(root, class), 0o755)
			os.WriteFile(filepath.Join(root, rel), b, 0o644)
			files[rel] = b
		}
	}
	os.WriteFile(filepath.Join(root, "README.txt"), []byte("not an image"), 0o644)
	return files
}

func flat(t *testing.T, x *tensors.Tensor) any {
	var out any
	x.MustConstFlatData(func(f any) {
		switch v := f.(type) {
		case []float32:
			out = append([]float32(nil), v...)
		case []int32:
			out = append([]int32(nil), v...)
		}
	})
	return out
}

func TestImageFolderTarAndLoader(t *testing.T) {
	root := t.TempDir()
	files := writeTree(t, filepath.Join(root, "tree"))
	src, err := ImageFolder(filepath.Join(root, "tree"))
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != 6 || !reflect.DeepEqual(src.Classes(), []string{"ant", "cat"}) || src.Label(0) != 0 || src.Label(5) != 1 {
		t.Fatalf("folder: %d images, classes %v", src.Len(), src.Classes())
	}
	// The same tree in a tar under train/.
	tarPath := writeTar(t, filepath.Join(root, "data.tar"), "train/", files)
	tsrc, err := ImageTar(tarPath, "train")
	if err != nil {
		t.Fatal(err)
	}
	pre := Preprocessor{Channels: 3, Height: 4, Width: 4, DoResize: true, Resample: 2, DoRescale: true, RescaleFactor: 1.0 / 255,
		DoNormalize: true, Mean: []float64{0.5, 0.5, 0.5}, Std: []float64{0.5, 0.5, 0.5}}
	a, err := LoadImages(src, pre)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadImages(tsrc, pre)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(flat(t, a["pixel_values"]), flat(t, b["pixel_values"])) || !reflect.DeepEqual(flat(t, a["labels"]), flat(t, b["labels"])) {
		t.Error("the folder and the tar of the same tree give different tensors")
	}
	if got := a["pixel_values"].Shape().Dimensions; !reflect.DeepEqual(got, []int{6, 3, 4, 4}) {
		t.Errorf("pixel_values %v", got)
	}
	// Resumable iterator: a restored loader continues with identical (augmented) batches.
	aug := &Augment{Pad: 1, Flip: true}
	l1, _ := NewImageLoader(src, pre, aug, 4, 7, true)
	l1.Next()
	state, _ := l1.State()
	want1, _ := l1.Next()
	want2, _ := l1.Next() // crosses into epoch 1
	l2, _ := NewImageLoader(src, pre, aug, 4, 7, true)
	if err := l2.Restore(state); err != nil {
		t.Fatal(err)
	}
	got1, _ := l2.Next()
	got2, _ := l2.Next()
	for k := range want1 {
		if !reflect.DeepEqual(flat(t, want1[k]), flat(t, got1[k])) || !reflect.DeepEqual(flat(t, want2[k]), flat(t, got2[k])) {
			t.Errorf("%s differs after Restore", k)
		}
	}
	other, _ := NewImageLoader(tsrc, pre, aug, 2, 8, true)
	if err := other.Restore(state); err == nil {
		t.Error("a position of another seed was accepted")
	}
	// The data changed since the position was taken: an image renamed (same count), one removed.
	names, _ := filepath.Glob(filepath.Join(root, "tree", "*", "*"))
	os.Rename(names[0], names[0]+".png")
	renamed, _ := ImageFolder(filepath.Join(root, "tree"))
	l3, _ := NewImageLoader(renamed, pre, aug, 4, 7, true)
	if err := l3.Restore(state); !errors.Is(err, ErrDataChanged) || !strings.Contains(err.Error(), "the same number of images (6)") {
		t.Errorf("renamed image: %v", err)
	}
	os.Remove(names[0] + ".png")
	fewer, _ := ImageFolder(filepath.Join(root, "tree"))
	l4, _ := NewImageLoader(fewer, pre, aug, 4, 7, true)
	if err := l4.Restore(state); !errors.Is(err, ErrDataChanged) || !strings.Contains(err.Error(), "it had 6 images, the data now has 5") {
		t.Errorf("removed image: %v", err)
	}
}

func TestImageErrors(t *testing.T) {
	empty := t.TempDir()
	os.MkdirAll(filepath.Join(empty, "cls"), 0o755)
	os.WriteFile(filepath.Join(empty, "cls", "notes.txt"), []byte("x"), 0o644)
	if _, err := ImageFolder(empty); err == nil || !strings.Contains(err.Error(), "holds no images") || !strings.Contains(err.Error(), ".png") {
		t.Errorf("empty folder: %v", err)
	}
	bad := t.TempDir()
	os.MkdirAll(filepath.Join(bad, "cls"), 0o755)
	os.WriteFile(filepath.Join(bad, "cls", "broken.png"), []byte("not a png"), 0o644)
	src, err := ImageFolder(bad)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Image(0); err == nil || !strings.Contains(err.Error(), "broken.png") {
		t.Errorf("corrupt image: %v", err)
	}
	trunc := filepath.Join(t.TempDir(), "t.tar")
	os.WriteFile(trunc, []byte(strings.Repeat("x", 700)), 0o644)
	if _, err := ImageTar(trunc, ""); err == nil {
		t.Error("a corrupt tar was accepted")
	}
	x := &IDX{Dims: []int{2, 2, 2}, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}}
	enc := x.Encode()
	if back, err := DecodeIDX(enc); err != nil || !reflect.DeepEqual(back, x) {
		t.Errorf("IDX round trip: %v %v", back, err)
	}
	raw := append([]byte{0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2}, 1, 2, 3)
	if _, err := DecodeIDX(raw); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated IDX: %v", err)
	}
	if _, err := DecodeIDX([]byte{0, 0, 9, 1, 0, 0, 0, 1, 5}); err == nil || !strings.Contains(err.Error(), "magic") {
		t.Errorf("wrong magic: %v", err)
	}
}

func TestInstructionsAndPacking(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.jsonl")
	os.WriteFile(p, []byte(`{"instruction": "Say hi.", "input": "", "output": "Hi!", "status": "ok"}
{"instruction": "Skip me.", "output": "x", "status": "too similar"}

{"instruction": "No status.", "input": "ctx", "output": "fine"}
`), 0o644)
	rows, err := ReadInstructions(p)
	if err != nil || len(rows) != 2 || rows[1].Input != "ctx" {
		t.Fatalf("%v %+v", err, rows)
	}
	os.WriteFile(p, []byte("{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"\"\"\"}\n"), 0o644)
	if _, err := ReadInstructions(p); err == nil || !strings.Contains(err.Error(), "a.jsonl:2:") {
		t.Errorf("malformed line: %v", err)
	}
	os.WriteFile(p, []byte("{\"instruction\": \"a\"}\n"), 0o644)
	if _, err := ReadInstructions(p); err == nil || !strings.Contains(err.Error(), ":1: an Alpaca row needs") {
		t.Errorf("missing output: %v", err)
	}
	blocks := Pack([][]int{{1, 2, 3}, {4, 5}, {6}}, 9, 3)
	if !reflect.DeepEqual(blocks, [][]int{{1, 2, 3}, {9, 4, 5}, {9, 6, 9}}) {
		t.Errorf("packing %v", blocks)
	}
	ex, err := TokenExamples([][]int{{5, 6, 7}, {8}}, [][]int{{-100, 6, 7}, {8}}, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := flat(t, ex["labels"]); !reflect.DeepEqual(got, []int32{-100, 6, 7, 8, -100, -100}) {
		t.Errorf("labels %v", got)
	}
	if got := flat(t, ex["attention_mask"]); !reflect.DeepEqual(got, []int32{1, 1, 1, 1, 0, 0}) {
		t.Errorf("mask %v", got)
	}
	if docs := Documents("a\nb\n\n\n c \n\n"); !reflect.DeepEqual(docs, []string{"a\nb", "c"}) {
		t.Errorf("documents %q", docs)
	}
}

// The real data, when present: the CIFAR-10 tar's layout and Fashion-MNIST's IDX files.
func TestRealImageData(t *testing.T) {
	dir := golden.SharedDir(t)
	src, err := ImageTar(filepath.Join(dir, "cifar10", "cifar10-subset-jpg.tar"), "test")
	if err != nil {
		t.Fatal(err)
	}
	if src.Len() != 2000 || len(src.Classes()) != 10 || src.Classes()[0] != "airplane" {
		t.Errorf("CIFAR-10 test: %d images, classes %v", src.Len(), src.Classes())
	}
	img, err := src.Image(1999)
	if err != nil || img.Bounds().Dx() != 32 {
		t.Errorf("CIFAR image: %v", err)
	}
	imgs, err := ReadIDX("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
	if err != nil {
		t.Skipf("Fashion-MNIST (Debian dataset-fashion-mnist) not installed: %v", err)
	}
	labs, err := ReadIDX("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")
	if err != nil {
		t.Fatal(err)
	}
	fm, err := IDXImages(imgs, labs, nil)
	if err != nil || fm.Len() != 10000 || len(fm.Classes()) != 10 {
		t.Fatalf("Fashion-MNIST: %v", err)
	}
	sub := Subset(fm, []int{5, 9}, 100)
	if sub.Len() != 200 || sub.Label(0) > 1 || sub.Classes()[1] != "9" {
		t.Errorf("subset: %d images", sub.Len())
	}
}

// TestIDXSizeBombs: IDX headers that declare huge or zero dimensions are refused from the header, before any
// allocation sized by them, and images too large a side are refused before decoding.
func TestIDXSizeBombs(t *testing.T) {
	for _, c := range []struct {
		name string
		raw  []byte
		want string
	}{
		{"huge", []byte{0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2}, "more than the file's 2 data bytes"},
		{"overflowing", []byte{0, 0, 8, 4, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0}, "more than the file's 0 data bytes"},
		{"zero", []byte{0, 0, 8, 3, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0}, "zero dimension"},
	} {
		if _, err := DecodeIDX(c.raw); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	images := &IDX{Dims: []int{1, 1 << 15, 1}, Data: make([]byte, 1<<15)}
	labels := &IDX{Dims: []int{1}, Data: []byte{0}}
	if _, err := IDXImages(images, labels, nil); err == nil || !strings.Contains(err.Error(), "a side") {
		t.Errorf("tall images: %v", err)
	}
}

// TestSplitFoldersAreNotClasses: a folder or tar whose top level is train/ and test/, each holding class folders,
// is refused with the --split to pass (read as classes it trained a 2-class "train vs test" classifier); with
// the split chosen it reads the classes.
func TestSplitFoldersAreNotClasses(t *testing.T) {
	root := filepath.Join(t.TempDir(), "splits")
	files := writeTree(t, filepath.Join(root, "train"))
	writeTree(t, filepath.Join(root, "test"))
	if _, err := ImageFolder(root); err == nil || !strings.Contains(err.Error(), "holds split folders [test train]") || !strings.Contains(err.Error(), "--split train") {
		t.Errorf("folder: %v", err)
	}
	if src, err := ImageFolder(filepath.Join(root, "train")); err != nil || !reflect.DeepEqual(src.Classes(), []string{"ant", "cat"}) {
		t.Errorf("the train split: %v", err)
	}
	tarPath := writeTar(t, filepath.Join(t.TempDir(), "data.tar"), "train/", files)
	if _, err := ImageTar(tarPath, ""); err == nil || !strings.Contains(err.Error(), "--split train") {
		t.Errorf("tar: %v", err)
	}
	if src, err := ImageTar(tarPath, "train"); err != nil || src.Len() != 6 {
		t.Errorf("the tar's train split: %v", err)
	}
}

// writeTar writes files (relative path -> bytes) into a tar at path, each under prefix, and returns path.
func writeTar(t *testing.T, path, prefix string, files map[string][]byte) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for rel, b := range files {
		tw.WriteHeader(&tar.Header{Name: prefix + filepath.ToSlash(rel), Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
		tw.Write(b)
	}
	tw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
