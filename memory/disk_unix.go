//go:build unix

package memory

import "golang.org/x/sys/unix"

// FreeDiskBytes returns the bytes an unprivileged process can still write on the filesystem holding path (an
// existing file or folder); ok is false where that cannot be read.
func FreeDiskBytes(path string) (free int64, ok bool) {
	var st unix.Statfs_t
	if unix.Statfs(path, &st) != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
