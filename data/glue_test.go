package data

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

// The row counts of ../shared/data/glue (its README) and spot checks of parsed rows.
func TestReadGLUE(t *testing.T) {
	root := filepath.Join(golden.SharedDir(t), "glue")
	for _, tc := range []struct {
		task, split string
		n           int
	}{
		{SST2, "train", 67349}, {SST2, "dev", 872}, {CoLA, "train", 7250 + 1301}, {CoLA, "dev", 1043}, // GLUE's 527 + 516 (the file has no newline after its last row, so wc -l says 1042)

		{RTE, "train", 2127 + 363}, {RTE, "dev", 277}, {STSB, "train", 5749}, {STSB, "dev", 1500},
		{MRPC, "train", 4076}, {MRPC, "dev", 1725},
	} {
		ex, err := ReadGLUE(root, tc.task, tc.split)
		if err != nil {
			t.Fatal(err)
		}
		if len(ex) != tc.n {
			t.Errorf("%s %s: %d examples, want %d", tc.task, tc.split, len(ex), tc.n)
		}
	}
	sst, _ := ReadGLUE(root, SST2, "dev")
	if sst[0].TextA != "it 's a charming and often affecting journey ." || sst[0].Label != 1 || sst[1].Label != 0 {
		t.Errorf("SST-2 dev row 0: %+v", sst[0])
	}
	sts, _ := ReadGLUE(root, STSB, "dev")
	if sts[1].TextA != "A young child is riding a horse." || math.Abs(sts[1].Score-4.75) > 1e-12 {
		t.Errorf("STS-B dev row 1: %+v", sts[1])
	}
	rte, _ := ReadGLUE(root, RTE, "dev")
	if rte[0].Label != 1 || rte[0].TextB != "Christopher Reeve had an accident." {
		t.Errorf("RTE dev row 0: %+v", rte[0])
	}
	mrpc, _ := ReadGLUE(root, MRPC, "dev")
	if mrpc[0].Label != 1 || mrpc[0].TextA[:4] != "PCCW" {
		t.Errorf("MRPC row 0: %+v", mrpc[0])
	}
}
