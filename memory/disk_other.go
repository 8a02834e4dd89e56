//go:build !unix

package memory

// FreeDiskBytes is not known on this system: ok is false.
func FreeDiskBytes(path string) (free int64, ok bool) { return 0, false }
