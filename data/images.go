package data

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"image"
	_ "image/jpeg" // decoders for ImageFolder and ImageTar
	_ "image/png"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/memfit/memfit/internal/readfile"
)

// ImageExtensions are the image files the folder and tar sources read.
var ImageExtensions = []string{".jpg", ".jpeg", ".png"}

// ImageSource is a labelled image dataset whose images are decoded on demand.
type ImageSource interface {
	// Len is the number of images.
	Len() int
	// Label is image i's class index into Classes.
	Label(i int) int
	// Classes are the class names, sorted.
	Classes() []string
	// Image decodes image i.
	Image(i int) (image.Image, error)
	// Name names image i in error messages (its file).
	Name(i int) string
}

func isImage(name string) bool {
	ext := strings.ToLower(filepath.Ext(name))
	for _, e := range ImageExtensions {
		if ext == e {
			return true
		}
	}
	return false
}

// entry is one image of a folder or tar tree.
type entry struct {
	name  string
	label int
	data  []byte // tar sources keep the encoded bytes; folder sources read the file when asked
}

type tree struct {
	classes []string
	entries []entry
	where   string
}

func (t *tree) Len() int          { return len(t.entries) }
func (t *tree) Label(i int) int   { return t.entries[i].label }
func (t *tree) Classes() []string { return t.classes }
func (t *tree) Name(i int) string { return t.entries[i].name }

func (t *tree) Image(i int) (image.Image, error) {
	e := t.entries[i]
	b := e.data
	if b == nil {
		var err error
		if b, err = readfile.Read(e.name, maxImageBytes); err != nil {
			return nil, err
		}
	}
	return DecodeImage(e.name, b)
}

// DecodeImage decodes an encoded image (PNG, JPEG) named name in messages. Its header is read first: a corrupt or
// hostile file can declare any size, and decoding would allocate it; images of more than maxImageSide pixels a
// side are refused before decoding.
func DecodeImage(name string, b []byte) (image.Image, error) {
	if err := CheckImageHeader(name, b); err != nil {
		return nil, err
	}
	img, _, err := image.Decode(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: not a decodable image: %v", name, err)
	}
	return img, nil
}

// CheckImageHeader reads an encoded image's header (not its pixels): an error names an image that is not PNG or
// JPEG, or whose declared size is not 1 to maxImageSide pixels a side.
func CheckImageHeader(name string, b []byte) error {
	cfg, _, err := image.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		what := "neither PNG nor JPEG"
		if len(b) > 0 && utf8.Valid(b) && !bytes.ContainsAny(b, "\x00") {
			what = "text, not PNG or JPEG bytes"
		}
		return fmt.Errorf("%s: not a decodable image (%s: %v)", name, what, err)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width > maxImageSide || cfg.Height > maxImageSide {
		return fmt.Errorf("%s: a %dx%d image: memfit reads images of 1 to %d pixels a side", name, cfg.Width, cfg.Height, maxImageSide)
	}
	return nil
}

// build sorts the class names found in paths (class/file) and labels the entries.
func build(where string, items []entry, classOf func(string) string) (*tree, error) {
	seen := map[string]bool{}
	for _, it := range items {
		seen[classOf(it.name)] = true
	}
	t := &tree{where: where}
	for c := range seen {
		t.classes = append(t.classes, c)
	}
	sort.Strings(t.classes)
	index := map[string]int{}
	for i, c := range t.classes {
		index[c] = i
	}
	sort.Slice(items, func(i, j int) bool { return items[i].name < items[j].name })
	for _, it := range items {
		it.label = index[classOf(it.name)]
		t.entries = append(t.entries, it)
	}
	if len(t.entries) == 0 {
		return nil, fmt.Errorf("%s holds no images: expected <class>/<image> files with extensions %s",
			where, strings.Join(ImageExtensions, ", "))
	}
	return t, nil
}

// ImageFolder lists the images of a folder tree root/<class>/<image>.jpg|jpeg|png (class names sorted give the
// labels; files elsewhere are ignored).
func ImageFolder(root string) (ImageSource, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s is not a folder", root)
	}
	classDirs, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var items []entry
	for _, d := range classDirs {
		if !d.IsDir() {
			continue
		}
		err := filepath.WalkDir(filepath.Join(root, d.Name()), func(p string, de os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !de.IsDir() && isImage(p) {
				items = append(items, entry{name: p})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	rels := make([]string, len(items))
	for i, it := range items {
		rel, _ := filepath.Rel(root, it.name)
		rels[i] = filepath.ToSlash(rel)
	}
	if err := splitsNotClasses(root, rels); err != nil {
		return nil, err
	}
	return build(root, items, func(p string) string {
		rel, _ := filepath.Rel(root, p)
		return strings.SplitN(filepath.ToSlash(rel), "/", 2)[0]
	})
}

// splitNames are top-level folder names that mean a dataset split, not a class.
var splitNames = map[string]bool{"train": true, "test": true, "val": true, "valid": true, "validation": true, "dev": true}

// splitsNotClasses refuses a tree whose top-level folders are all split names (train/, test/, ...) each holding
// class folders: read as classes, it would train a classifier of splits.
func splitsNotClasses(where string, rels []string) error {
	tops := map[string]bool{}
	for _, r := range rels {
		parts := strings.Split(r, "/")
		if len(parts) < 3 || !splitNames[parts[0]] {
			return nil
		}
		tops[parts[0]] = true
	}
	if len(tops) == 0 {
		return nil
	}
	names := make([]string, 0, len(tops))
	for t := range tops {
		names = append(names, t)
	}
	sort.Strings(names)
	pick := names[0]
	if tops["train"] {
		pick = "train"
	}
	return fmt.Errorf("%s holds split folders %v with the class folders inside them: choose one with --split (e.g. --split %s)", where, names, pick)
}

// ImageTar lists the images of a tar (plain or gzip-compressed) holding a tree [prefix/]<class>/<image>; prefix
// ("train", "test", ...) selects a subtree, "" takes the top level. The encoded image bytes stay in memory
// (compressed, as in the tar); images are decoded when asked for.
func ImageTar(tarPath, prefix string) (ImageSource, error) {
	f, err := readfile.Open(tarPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	head := make([]byte, 2)
	if n, _ := io.ReadFull(f, head); n == 2 && head[0] == 0x1f && head[1] == 0x8b {
		f.Seek(0, io.SeekStart)
		z, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tarPath, err)
		}
		r = z
	} else {
		f.Seek(0, io.SeekStart)
	}
	prefix = strings.Trim(prefix, "/")
	tr := tar.NewReader(r)
	var items []entry
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: corrupt or truncated tar: %v", tarPath, err)
		}
		if h.Typeflag != tar.TypeReg || !isImage(h.Name) {
			continue
		}
		name := strings.TrimPrefix(path.Clean(h.Name), "./")
		if prefix != "" {
			if !strings.HasPrefix(name, prefix+"/") {
				continue
			}
			name = strings.TrimPrefix(name, prefix+"/")
		}
		if !strings.Contains(name, "/") {
			continue
		}
		if h.Size > maxImageBytes {
			return nil, fmt.Errorf("%s: %s is %d bytes: more than the %d an encoded image may have", tarPath, h.Name, h.Size, maxImageBytes)
		}
		b, err := io.ReadAll(io.LimitReader(tr, maxImageBytes+1)) // a sparse entry can read as more than h.Size
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %v", tarPath, h.Name, err)
		}
		if len(b) > maxImageBytes {
			return nil, fmt.Errorf("%s: %s reads as more than the %d bytes an encoded image may have", tarPath, h.Name, maxImageBytes)
		}
		items = append(items, entry{name: name, data: b})
	}
	where := tarPath
	if prefix != "" {
		where += ":" + prefix
	} else {
		rels := make([]string, len(items))
		for i, it := range items {
			rels[i] = it.name
		}
		if err := splitsNotClasses(tarPath, rels); err != nil {
			return nil, err
		}
	}
	t, err := build(where, items, func(p string) string { return strings.SplitN(p, "/", 2)[0] })
	if err != nil {
		return nil, err
	}
	for i := range t.entries {
		t.entries[i].name = where + "/" + t.entries[i].name
	}
	return t, nil
}

// idxSource serves IDX images (grey, [N, H, W]) with their labels.
type idxSource struct {
	images, labels *IDX
	classes        []string
}

// maxImageSide bounds the width and height of an image memfit decodes (a corrupt header cannot ask for
// gigabytes).
const maxImageSide = 1 << 14

// maxImageBytes bounds an encoded image read from a tar.
const maxImageBytes = 64 << 20

// IDXImages makes a source of IDX images and labels (MNIST, Fashion-MNIST); classes names the labels (nil: "0",
// "1", ... up to the largest label).
func IDXImages(images, labels *IDX, classes []string) (ImageSource, error) {
	if len(images.Dims) != 3 || len(labels.Dims) != 1 || images.Dims[0] != labels.Dims[0] {
		return nil, fmt.Errorf("IDX images %v and labels %v do not pair up (want [N, H, W] and [N])", images.Dims, labels.Dims)
	}
	if images.Dims[1] > maxImageSide || images.Dims[2] > maxImageSide {
		return nil, fmt.Errorf("IDX images of %dx%d pixels: more than the %d a side memfit reads", images.Dims[1], images.Dims[2], maxImageSide)
	}
	if classes == nil {
		top := 0
		for _, l := range labels.Data {
			top = max(top, int(l))
		}
		for c := 0; c <= top; c++ {
			classes = append(classes, fmt.Sprint(c))
		}
	}
	for i, l := range labels.Data {
		if int(l) >= len(classes) {
			return nil, fmt.Errorf("IDX label %d of image %d is outside the %d classes", l, i, len(classes))
		}
	}
	return &idxSource{images: images, labels: labels, classes: classes}, nil
}

func (s *idxSource) Len() int          { return s.images.Dims[0] }
func (s *idxSource) Label(i int) int   { return int(s.labels.Data[i]) }
func (s *idxSource) Classes() []string { return s.classes }
func (s *idxSource) Name(i int) string { return fmt.Sprintf("IDX image %d", i) }

func (s *idxSource) Image(i int) (image.Image, error) {
	h, w := s.images.Dims[1], s.images.Dims[2]
	return &image.Gray{Pix: s.images.Data[i*h*w : (i+1)*h*w], Stride: w, Rect: image.Rect(0, 0, w, h)}, nil
}

// Subset returns the images of src whose labels are in keep, relabelled by keep's order (keep[0] becomes 0), at
// most perClass of each (0: all).
func Subset(src ImageSource, keep []int, perClass int) ImageSource {
	s := &subset{src: src, newLabel: map[int]int{}}
	for i, k := range keep {
		s.newLabel[k] = i
		s.classes = append(s.classes, src.Classes()[k])
	}
	count := map[int]int{}
	for i := 0; i < src.Len(); i++ {
		l := src.Label(i)
		if _, ok := s.newLabel[l]; ok && (perClass == 0 || count[l] < perClass) {
			s.index = append(s.index, i)
			count[l]++
		}
	}
	return s
}

type subset struct {
	src      ImageSource
	index    []int
	newLabel map[int]int
	classes  []string
}

func (s *subset) Len() int                         { return len(s.index) }
func (s *subset) Label(i int) int                  { return s.newLabel[s.src.Label(s.index[i])] }
func (s *subset) Classes() []string                { return s.classes }
func (s *subset) Image(i int) (image.Image, error) { return s.src.Image(s.index[i]) }
func (s *subset) Name(i int) string                { return s.src.Name(s.index[i]) }
