package evals

import (
	"math"
	"reflect"
	"testing"
)

func near(t *testing.T, name string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-12 {
		t.Errorf("%s = %.15g, want %.15g", name, got, want)
	}
}

func TestMetricsByHand(t *testing.T) {
	pred := []int{1, 1, 0, 0, 1, 0, 1, 0}
	gold := []int{1, 0, 0, 1, 1, 0, 1, 1}
	// TP = 3 (0, 4, 6), FP = 1 (1), TN = 2 (2, 5), FN = 2 (3, 7).
	acc, _ := Accuracy(pred, gold)
	near(t, "accuracy", acc, 5.0/8)
	f1, _ := F1(pred, gold)
	near(t, "F1", f1, 6.0/9) // 2*3 / (2*3 + 1 + 2)
	mcc, _ := MatthewsCorrelation(pred, gold)
	near(t, "MCC", mcc, (3*2-1*2)/math.Sqrt(4*5*3*4)) // (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))
	if m, _ := MatthewsCorrelation([]int{1, 1}, []int{1, 0}); m != 0 {
		t.Errorf("MCC with an empty row of the confusion matrix = %g, want 0", m)
	}
	// Pearson of x = 1..4, y = 2, 4, 5, 9: means 2.5 and 5; dx = -1.5 -.5 .5 1.5; dy = -3 -1 0 4;
	// sxy = 4.5 + .5 + 0 + 6 = 11; sxx = 5; syy = 9 + 1 + 0 + 16 = 26.
	p, _ := Pearson([]float64{1, 2, 3, 4}, []float64{2, 4, 5, 9})
	near(t, "Pearson", p, 11/math.Sqrt(5*26))
	// Ties get average ranks: 10, 20, 20, 30 -> 1, 2.5, 2.5, 4.
	if r := Ranks([]float64{10, 20, 20, 30}); !reflect.DeepEqual(r, []float64{1, 2.5, 2.5, 4}) {
		t.Errorf("ranks %v", r)
	}
	// Spearman of x = 1, 2, 2, 3 (ranks 1, 2.5, 2.5, 4) and y = 1, 3, 2, 4 (ranks 1, 3, 2, 4):
	// dx = -1.5, 0, 0, 1.5; dy = -1.5, .5, -.5, 1.5; sxy = 2.25 + 2.25 = 4.5; sxx = 4.5; syy = 5.
	s, _ := Spearman([]float64{1, 2, 2, 3}, []float64{1, 3, 2, 4})
	near(t, "Spearman", s, 4.5/math.Sqrt(4.5*5))
	if _, err := Accuracy([]int{1}, []int{1, 0}); err == nil {
		t.Error("length mismatch accepted")
	}
}
