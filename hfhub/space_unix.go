//go:build linux || darwin || freebsd

package hfhub

import (
	"os"
	"syscall"
)

// freeSpace is the bytes an unprivileged user may still write on dir's file system (the nearest existing
// folder's).
func freeSpace(dir string) (int64, error) {
	for {
		var st syscall.Statfs_t
		err := syscall.Statfs(dir, &st)
		if err == nil {
			return int64(st.Bavail) * int64(st.Bsize), nil
		}
		if !os.IsNotExist(err) {
			return -1, err
		}
		parent := dir[:max(0, lastSlash(dir))]
		if parent == "" || parent == dir {
			return -1, err
		}
		dir = parent
	}
}

func lastSlash(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return i
		}
	}
	return -1
}
