package loss_test

import (
	"math"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/loss"
)

// softmaxStats returns a row's maximum m and sum(exp(row - m)), in float64: softmax = exp(row - m) / s.
func softmaxStats(row []float32) (m, s float64) {
	m = math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, float64(v))
	}
	for _, v := range row {
		s += math.Exp(float64(v) - m)
	}
	return m, s
}

// reference computes the loss and its gradient on the host in float64.
func reference(logits []float32, labels []int32, classes int) (float64, []float64) {
	rows := len(labels)
	grad := make([]float64, len(logits))
	total, count := 0.0, 0
	for r := 0; r < rows; r++ {
		if labels[r] == loss.IgnoreIndex {
			continue
		}
		count++
	}
	for r := 0; r < rows; r++ {
		if labels[r] == loss.IgnoreIndex {
			continue
		}
		row := logits[r*classes : (r+1)*classes]
		m, s := softmaxStats(row)
		lse := m + math.Log(s)
		total += lse - float64(row[labels[r]])
		for c, v := range row {
			p := math.Exp(float64(v)-m) / s
			if c == int(labels[r]) {
				p--
			}
			grad[r*classes+c] = p / float64(max(count, 1))
		}
	}
	return total / float64(max(count, 1)), grad
}

func TestCrossEntropy(t *testing.T) {
	const b, n, c = 2, 5, 7
	logits := gtest.Rand(1, b*n*c, 3)
	labels := []int32{0, 6, 3, loss.IgnoreIndex, 2, 5, loss.IgnoreIndex, 1, 1, 4}
	wantLoss, wantGrad := reference(logits, labels, c)
	// With the backend's fused softmax (fusedLogSumExp) and with plain ops (logSumExp, what XLA gets).
	for _, fusion := range []string{"1", "0"} {
		t.Setenv(graph.FusionEnv, fusion)
		out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			l := loss.CrossEntropy(p[0], p[1], loss.IgnoreIndex)
			return append([]*graph.Node{l}, engine.Gradient(l, p[0])...)
		}, gtest.Tensor(logits, b, n, c), tensors.FromFlatDataAndDimensions(labels, b, n))
		if d := math.Abs(float64(out[0][0]) - wantLoss); d > 1e-6 {
			t.Errorf("fusion=%s: loss %g, want %g", fusion, out[0][0], wantLoss)
		}
		for i := range wantGrad {
			if d := math.Abs(float64(out[1][i]) - wantGrad[i]); d > 1e-6 {
				t.Fatalf("fusion=%s: grad[%d] = %g, want %g", fusion, i, out[1][i], wantGrad[i])
			}
		}
	}
}

func TestCrossEntropyAllIgnored(t *testing.T) {
	out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		l := loss.CrossEntropy(p[0], p[1], loss.IgnoreIndex)
		return append([]*graph.Node{l}, engine.Gradient(l, p[0])...)
	}, gtest.Tensor([]float32{1, 2, 3, 4}, 2, 2), tensors.FromFlatDataAndDimensions([]int32{-100, -100}, 2))
	if out[0][0] != 0 || gtest.MaxAbsDiff(out[1], []float32{0, 0, 0, 0}) != 0 {
		t.Errorf("loss %v, grad %v; want 0 and zeros", out[0], out[1])
	}
}

// TestTokenLogProbs checks the per-position log-probabilities and the gradient of their weighted sum against a
// float64 host reference: log softmax(logits)[label] (0 where ignored), and d/dlogits sum(w * lp) =
// w * (onehot(label) - softmax) on the positions not ignored.
func TestTokenLogProbs(t *testing.T) {
	const b, n, c = 2, 5, 7
	logits := gtest.Rand(3, b*n*c, 3)
	labels := []int32{0, 6, 3, loss.IgnoreIndex, 2, 5, loss.IgnoreIndex, 1, 1, 4}
	weights := gtest.Rand(4, b*n, 1)
	wantLP := make([]float64, b*n)
	wantGrad := make([]float64, b*n*c)
	for r := range labels {
		if labels[r] == loss.IgnoreIndex {
			continue
		}
		row := logits[r*c : (r+1)*c]
		m, s := softmaxStats(row)
		wantLP[r] = float64(row[labels[r]]) - m - math.Log(s)
		for k, v := range row {
			g := -math.Exp(float64(v)-m) / s
			if k == int(labels[r]) {
				g++
			}
			wantGrad[r*c+k] = float64(weights[r]) * g
		}
	}
	for _, fusion := range []string{"1", "0"} {
		t.Setenv(graph.FusionEnv, fusion)
		out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			lp := loss.TokenLogProbs(p[0], p[1], loss.IgnoreIndex)
			return append([]*graph.Node{lp}, engine.Gradient(graph.ReduceAllSum(graph.Mul(lp, p[2])), p[0])...)
		}, gtest.Tensor(logits, b, n, c), tensors.FromFlatDataAndDimensions(labels, b, n), gtest.Tensor(weights, b, n))
		for i, w := range wantLP {
			if d := math.Abs(float64(out[0][i]) - w); d > 1e-6 {
				t.Errorf("fusion=%s: log-prob[%d] = %g, want %g", fusion, i, out[0][i], w)
			}
		}
		for i, w := range wantGrad {
			if d := math.Abs(float64(out[1][i]) - w); d > 1e-6 {
				t.Fatalf("fusion=%s: grad[%d] = %g, want %g", fusion, i, out[1][i], w)
			}
		}
	}
}
