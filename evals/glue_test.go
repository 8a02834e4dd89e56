package evals

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/data"
)

func TestScoreGLUE(t *testing.T) {
	gold := []data.GLUEExample{{Label: 1}, {Label: 0}, {Label: 1}, {Label: 1}}
	r, err := ScoreGLUE(data.MRPC, gold, []float64{1, 1, 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	// TP 2, FP 1, FN 1: accuracy 2/4, F1 4/6; majority class 1 is 3/4.
	if r.Metrics["accuracy"] != 0.5 || math.Abs(r.Metrics["f1"]-4.0/6) > 1e-12 || r.Majority != 0.75 {
		t.Errorf("MRPC %+v", r)
	}
	r, _ = ScoreGLUE(data.CoLA, gold, []float64{1, 0, 1, 1})
	if r.Metrics["matthews_correlation"] != 1 {
		t.Errorf("CoLA perfect predictions: %+v", r.Metrics)
	}
	sts := []data.GLUEExample{{Score: 1}, {Score: 2}, {Score: 2}, {Score: 5}}
	r, _ = ScoreGLUE(data.STSB, sts, []float64{0.5, 1, 3, 4})
	if _, ok := r.Metrics["pearson"]; !ok || math.Abs(r.Metrics["spearman"]-(4.5/math.Sqrt(5*4.5))) > 1e-12 {
		t.Errorf("STS-B %+v", r.Metrics) // predicted ranks 1..4 (d = -1.5 -.5 .5 1.5), gold 1, 2.5, 2.5, 4 (d = -1.5 0 0 1.5): 4.5 / sqrt(5 x 4.5)
	}
	if _, err := ScoreGLUE(data.SST2, gold, []float64{1, 0, 2, 1}); err == nil {
		t.Error("class 2 accepted for SST-2")
	}
	if _, err := ScoreGLUE(data.SST2, gold, []float64{1}); err == nil {
		t.Error("too few predictions accepted")
	}
	p := filepath.Join(t.TempDir(), "p.txt")
	os.WriteFile(p, []byte("1\n0\nx\n"), 0o644)
	if _, err := ReadPredictions(p); err == nil || !strings.Contains(err.Error(), "p.txt:3") {
		t.Errorf("bad predictions file: %v", err)
	}
}
