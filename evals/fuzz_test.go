package evals

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Fuzz targets for the evaluation files a user feeds memfit (MMLU CSV, GLUE predictions): any bytes give an
// error or a result, never a panic (CI runs them briefly under a memory cap: .ci/run, "fuzz").

func FuzzReadMMLUFile(f *testing.F) {
	f.Add([]byte("question,A,B,C,D,answer\nWhat is 2+2?,1,2,3,4,D\n\"a, b\",x,y,z,w,0\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = ReadMMLUFile(fuzzFile("x_test.csv", raw), "x")
	})
}

func FuzzReadPredictions(f *testing.F) {
	f.Add([]byte("0\n1\n2.5\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = ReadPredictions(fuzzFile("p.txt", raw))
	})
}

// fuzzDir is one folder per fuzzing process that the targets overwrite their input files in (a fresh
// t.TempDir per input made the runs stall on the build VM's disk).
var fuzzDir = sync.OnceValue(func() string {
	d, err := os.MkdirTemp("", "memfit-fuzz-")
	if err != nil {
		panic(err)
	}
	return d
})

// fuzzFile writes raw to name under fuzzDir (sub-folders created) and returns its path.
func fuzzFile(name string, raw []byte) string {
	p := filepath.Join(fuzzDir(), name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, raw, 0o644)
	return p
}
