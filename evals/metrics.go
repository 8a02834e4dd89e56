// Package evals evaluates models on MMLU (5-shot multiple choice, scored as the usual harnesses do) and GLUE
// (sequence classification and regression), with the metrics each task reports.
package evals

import (
	"fmt"
	"math"
	"sort"
)

// Accuracy is the fraction of predictions equal to their label.
func Accuracy(pred, gold []int) (float64, error) {
	if err := sameLen(len(pred), len(gold)); err != nil {
		return 0, err
	}
	ok := 0
	for i := range pred {
		if pred[i] == gold[i] {
			ok++
		}
	}
	return float64(ok) / float64(len(pred)), nil
}

// F1 is the F1 score of the positive class 1: 2 TP / (2 TP + FP + FN) (0 when there is no positive at all).
func F1(pred, gold []int) (float64, error) {
	if err := sameLen(len(pred), len(gold)); err != nil {
		return 0, err
	}
	var tp, fp, fn float64
	for i := range pred {
		switch {
		case pred[i] == 1 && gold[i] == 1:
			tp++
		case pred[i] == 1:
			fp++
		case gold[i] == 1:
			fn++
		}
	}
	if tp == 0 {
		return 0, nil
	}
	return 2 * tp / (2*tp + fp + fn), nil
}

// MatthewsCorrelation is the Matthews correlation coefficient of binary predictions:
// (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)), 0 when a factor of the denominator is 0 (as sklearn).
func MatthewsCorrelation(pred, gold []int) (float64, error) {
	if err := sameLen(len(pred), len(gold)); err != nil {
		return 0, err
	}
	var tp, tn, fp, fn float64
	for i := range pred {
		switch {
		case pred[i] == 1 && gold[i] == 1:
			tp++
		case pred[i] != 1 && gold[i] != 1:
			tn++
		case pred[i] == 1:
			fp++
		default:
			fn++
		}
	}
	den := math.Sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
	if den == 0 {
		return 0, nil
	}
	return (tp*tn - fp*fn) / den, nil
}

// Pearson is the Pearson correlation of x and y (NaN when either is constant).
func Pearson(x, y []float64) (float64, error) {
	if err := sameLen(len(x), len(y)); err != nil {
		return 0, err
	}
	n := float64(len(x))
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx, my = mx/n, my/n
	var sxy, sxx, syy float64
	for i := range x {
		dx, dy := x[i]-mx, y[i]-my
		sxy += dx * dy
		sxx += dx * dx
		syy += dy * dy
	}
	return sxy / math.Sqrt(sxx*syy), nil
}

// Spearman is the Spearman rank correlation: the Pearson correlation of the ranks, tied values getting the
// average of the ranks they span (as scipy.stats.spearmanr).
func Spearman(x, y []float64) (float64, error) {
	if err := sameLen(len(x), len(y)); err != nil {
		return 0, err
	}
	return Pearson(Ranks(x), Ranks(y))
}

// Ranks returns the 1-based ranks of x, ties averaged.
func Ranks(x []float64) []float64 {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return x[idx[a]] < x[idx[b]] })
	r := make([]float64, len(x))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && x[idx[j+1]] == x[idx[i]] {
			j++
		}
		avg := float64(i+j)/2 + 1
		for k := i; k <= j; k++ {
			r[idx[k]] = avg
		}
		i = j + 1
	}
	return r
}

func sameLen(a, b int) error {
	if a != b {
		return fmt.Errorf("%d predictions for %d references", a, b)
	}
	if a == 0 {
		return fmt.Errorf("no predictions")
	}
	return nil
}
