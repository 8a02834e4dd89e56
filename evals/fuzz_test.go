package evals

import (
	"testing"

	"github.com/memfit/memfit/internal/fuzzfile"
)

// Fuzz targets for the evaluation files a user feeds memfit (MMLU CSV, GLUE predictions): any bytes give an
// error or a result, never a panic (CI runs them briefly under a memory cap: .ci/run, "fuzz").

func FuzzReadMMLUFile(f *testing.F) {
	f.Add([]byte("question,A,B,C,D,answer\nWhat is 2+2?,1,2,3,4,D\n\"a, b\",x,y,z,w,0\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = ReadMMLUFile(fuzzfile.Write("x_test.csv", raw), "x")
	})
}

func FuzzReadPredictions(f *testing.F) {
	f.Add([]byte("0\n1\n2.5\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = ReadPredictions(fuzzfile.Write("p.txt", raw))
	})
}
