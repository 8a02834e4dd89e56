package evals

import (
	"os"
	"path/filepath"
	"testing"
)

// Fuzz targets for the evaluation files a user feeds memfit (MMLU CSV, GLUE predictions): any bytes give an
// error or a result, never a panic (CI runs them briefly under a memory cap: .ci/run, "fuzz").

func FuzzReadMMLUFile(f *testing.F) {
	f.Add([]byte("question,A,B,C,D,answer\nWhat is 2+2?,1,2,3,4,D\n\"a, b\",x,y,z,w,0\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		path := filepath.Join(t.TempDir(), "x_test.csv")
		os.WriteFile(path, raw, 0o644)
		_, _ = ReadMMLUFile(path, "x")
	})
}

func FuzzReadPredictions(f *testing.F) {
	f.Add([]byte("0\n1\n2.5\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		path := filepath.Join(t.TempDir(), "p.txt")
		os.WriteFile(path, raw, 0o644)
		_, _ = ReadPredictions(path)
	})
}
