package hfhub

import (
	"errors"
	"io"
	"io/fs"
	"path"
	"slices"
	"time"
)

// listFS is a repository's file list as a read-only fs.FS (names and sizes, no contents; a file read is the
// local copy when there is one), so that the function that picks a dataset's files in a local folder picks
// them in a listing of the Hub the same way.
type listFS struct {
	files map[string]File
	dirs  map[string][]string // folder ("." for the root) -> its entries' names, sorted
	open  func(name string) (fs.File, error)
}

func newListFS(files []File, open func(name string) (fs.File, error)) *listFS {
	l := &listFS{files: map[string]File{}, dirs: map[string][]string{".": nil}, open: open}
	for _, f := range files {
		l.files[f.Path] = f
		child := f.Path
		for dir := path.Dir(child); ; dir = path.Dir(dir) {
			kids, seen := l.dirs[dir]
			base := path.Base(child)
			if !slices.Contains(kids, base) {
				l.dirs[dir] = append(kids, base)
			}
			if dir == "." || seen {
				break
			}
			child = dir
		}
	}
	for d := range l.dirs {
		slices.Sort(l.dirs[d])
	}
	return l
}

type listInfo struct {
	name string
	size int64
	dir  bool
}

func (i listInfo) Name() string { return i.name }
func (i listInfo) Size() int64  { return i.size }
func (i listInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o555
	}
	return 0o444
}
func (i listInfo) ModTime() time.Time         { return time.Time{} }
func (i listInfo) IsDir() bool                { return i.dir }
func (i listInfo) Sys() any                   { return nil }
func (i listInfo) Type() fs.FileMode          { return i.Mode().Type() }
func (i listInfo) Info() (fs.FileInfo, error) { return i, nil }

func (l *listFS) Stat(name string) (fs.FileInfo, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrInvalid}
	}
	if f, ok := l.files[name]; ok {
		return listInfo{name: path.Base(name), size: f.Size}, nil
	}
	if _, ok := l.dirs[name]; ok {
		return listInfo{name: path.Base(name), dir: true}, nil
	}
	return nil, &fs.PathError{Op: "stat", Path: name, Err: fs.ErrNotExist}
}

func (l *listFS) ReadDir(name string) ([]fs.DirEntry, error) {
	kids, ok := l.dirs[name]
	if !ok {
		if _, isFile := l.files[name]; isFile {
			return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrInvalid}
		}
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: fs.ErrNotExist}
	}
	out := make([]fs.DirEntry, 0, len(kids))
	for _, k := range kids {
		p := path.Join(name, k)
		if f, isFile := l.files[p]; isFile {
			out = append(out, listInfo{name: k, size: f.Size})
		} else {
			out = append(out, listInfo{name: k, dir: true})
		}
	}
	return out, nil
}

// Open opens a folder (for fs.ReadDir and fs.WalkDir) or, through open, a file's content.
func (l *listFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if _, ok := l.dirs[name]; ok {
		entries, _ := l.ReadDir(name)
		return &listDir{info: listInfo{name: path.Base(name), dir: true}, entries: entries}, nil
	}
	if _, ok := l.files[name]; ok && l.open != nil {
		return l.open(name)
	}
	if _, ok := l.files[name]; ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: errNoContent}
	}
	return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
}

var errNoContent = errors.New("a listing holds no contents")

type listDir struct {
	info    listInfo
	entries []fs.DirEntry
	pos     int
}

func (d *listDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *listDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.info.name, Err: fs.ErrInvalid}
}
func (d *listDir) Close() error { return nil }
func (d *listDir) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.pos:]
	if n <= 0 {
		d.pos = len(d.entries)
		return rest, nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	k := min(n, len(rest))
	d.pos += k
	return rest[:k], nil
}
