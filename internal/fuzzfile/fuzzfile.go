// Package fuzzfile gives fuzz targets that parse files a place to write their inputs: one folder per fuzzing
// process, overwritten input after input (a fresh t.TempDir per input made the runs stall on the build VM's
// disk).
package fuzzfile

import (
	"os"
	"path/filepath"
	"sync"
)

var dir = sync.OnceValue(func() string {
	d, err := os.MkdirTemp("", "memfit-fuzz-")
	if err != nil {
		panic(err)
	}
	return d
})

// Write writes raw to name under the process's fuzz folder (sub-folders created) and returns its path.
func Write(name string, raw []byte) string {
	p := filepath.Join(dir(), name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, raw, 0o644)
	return p
}
