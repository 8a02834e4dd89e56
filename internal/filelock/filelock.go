// Package filelock takes advisory locks on files, to make processes that share a cache folder take turns: one
// installs or downloads, the others wait and then find the work done. On Unix it is flock(2), the lock Python's
// filelock package (and so huggingface_hub) takes too, so memfit and Python processes share one lock file.
// Elsewhere (Windows, Plan 9, wasm) locking is a no-op: a second process is not held back.
package filelock

import (
	"fmt"
	"os"
	"path/filepath"
)

// Lock takes an exclusive lock on path (creating the file and its folder when missing), waiting while another
// process holds it. release gives the lock back; the file stays (removing it would race with a waiter).
func Lock(path string) (release func(), err error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	if err := lock(f, true); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { unlock(f); f.Close() }, nil
}

// TryLock is Lock without waiting: ok is false (and release nil) when another process holds the lock.
func TryLock(path string) (release func(), ok bool, err error) {
	f, err := open(path)
	if err != nil {
		return nil, false, err
	}
	switch err := lock(f, false); {
	case err == errBusy:
		f.Close()
		return nil, false, nil
	case err != nil:
		f.Close()
		return nil, false, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { unlock(f); f.Close() }, true, nil
}

func open(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
}
