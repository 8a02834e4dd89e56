package hfhub

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestCacheWriteError: a cache that cannot be written (a read-only file system, no permission) is one line naming
// the cache and what to do (probe 2026-11-27-b r2, r3, r5: the error named a hidden temporary file or a lock
// file). Other errors, and errors of files outside the cache, pass unchanged. (A read-only mount cannot be made
// in the test, nor, as root, a folder that cannot be written: the errors are the ones the probe met.)
func TestCacheWriteError(t *testing.T) {
	cache := t.TempDir()
	c := New(Env{Endpoint: DefaultEndpoint, Cache: cache}, nil)
	for _, e := range []error{
		&fs.PathError{Op: "open", Path: filepath.Join(cache, "models--a--b", "trees", ".x.json.123.tmp"), Err: syscall.EROFS},
		fmt.Errorf("lock: %w", &fs.PathError{Op: "open", Path: filepath.Join(cache, ".locks", "datasets--a--b", "e.lock"), Err: syscall.EACCES}),
	} {
		got := c.cacheWriteError(e)
		if !strings.HasPrefix(got.Error(), "the Hub cache "+cache+" cannot be written (") || !strings.Contains(got.Error(), "set HF_HUB_CACHE (or HF_HOME) to a folder you can write") {
			t.Errorf("%v became %v", e, got)
		}
	}
	for _, e := range []error{
		&fs.PathError{Op: "open", Path: "/elsewhere/x", Err: syscall.EROFS},
		&fs.PathError{Op: "open", Path: filepath.Join(cache, "x"), Err: syscall.ENOENT},
		errors.New("other"),
		nil,
	} {
		if got := c.cacheWriteError(e); got != e {
			t.Errorf("%v became %v", e, got)
		}
	}
}
