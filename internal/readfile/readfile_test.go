package readfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadIsBounded: a link to /dev/zero, a folder and a named pipe are refused at once (they were read without
// end, or blocked), a file one byte over the bound is refused, one at the bound is read, a missing file keeps
// os.ReadFile's error.
func TestReadIsBounded(t *testing.T) {
	dir := t.TempDir()
	zero := filepath.Join(dir, "zero.json")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	pipe := filepath.Join(dir, "pipe.json")
	if err := syscall.Mkfifo(pipe, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{zero: "is a character device", dir: "is a folder", pipe: "is a named pipe"} {
		done := make(chan error, 2)
		go func() { _, err := Read(path, Config); done <- err }()
		go func() { _, err := Open(path); done <- err }()
		for range 2 {
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: %v, want %q", path, err, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: Read or Open did not return", path)
			}
		}
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := Read(file, 5); err != nil || string(b) != "12345" {
		t.Errorf("at the bound: %q, %v", b, err)
	}
	var big *TooLargeError
	if _, err := Read(file, 4); !errors.As(err, &big) || big.Limit != 4 {
		t.Errorf("over the bound: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "missing"), 4); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	// /proc files report size 0: the bound is on what is read.
	if b, err := Read("/proc/self/status", Config); err != nil || len(b) == 0 {
		t.Errorf("/proc/self/status: %d bytes, %v", len(b), err)
	}
	if _, err := Read("/proc/self/status", 16); !errors.As(err, &big) {
		t.Errorf("/proc/self/status over 16 bytes: %v", err)
	}
	if got := FormatSize(64 << 20); got != "64 MiB" {
		t.Errorf("FormatSize: %s", got)
	}
}

// TestNoUnboundedReads: memfit's code reads whole files only through Read (a regular-file check and a bound):
// os.ReadFile and io.ReadAll appear nowhere else outside tests and tools/, except io.ReadAll of an
// io.LimitReader.
func TestNoUnboundedReads(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (n == "tools" || n == "node_modules" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(raw), "\n") {
			if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "//") {
				continue
			}
			if strings.Contains(line, "os.ReadFile(") || strings.Contains(line, "io.ReadAll(") && !strings.Contains(line, "io.LimitReader(") {
				t.Errorf("%s:%d reads a whole file without a bound: use readfile.Read(path, limit): %s", p, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
