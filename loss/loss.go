// Package loss holds training losses whose backward passes keep as little as possible.
package loss

import (
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// IgnoreIndex is the label value that CrossEntropy leaves out, as in PyTorch and Hugging Face (-100).
const IgnoreIndex = -100

// CrossEntropy returns the mean cross entropy of logits [..., C] against integer labels [...] (class indices),
// leaving out positions whose label is ignoreIndex (from both the sum and the count); it is 0 when every label
// is ignored. The result is a float scalar of the logits' dtype.
//
// Forward: with lse = log(sum(exp(logits))) over the classes (logSumExp, or fusedLogSumExp where the backend has
// a fused softmax) and picked = logits[label], loss = sum(mask * (lse - picked)) / max(count, 1).
//
// Backward: d lse / d logits = softmax(logits) (see logSumExp and fusedLogSumExp for what each keeps); the label
// pick is a Gather whose gradient scatters -mask/count into the labelled classes. The labels are kept too.
func CrossEntropy(logits, labels *graph.Node, ignoreIndex int) *graph.Node {
	lse, picked, mask := labelTerms(logits, labels, ignoreIndex, "CrossEntropy")
	g := logits.Graph()
	total := graph.ReduceAllSum(graph.Mul(graph.Sub(lse, picked), mask))
	count := graph.Max(graph.ReduceAllSum(mask), graph.ScalarOne(g, logits.DType()))
	return graph.Div(total, graph.StopGradient(count))
}

// TokenLogProbs returns the log-probability that logits [..., C] give each label of labels [...] (class
// indices), log softmax(logits)[label], and 0 where the label is ignoreIndex: a float tensor shaped as labels, of
// the logits' dtype. Summed over a sequence's positions it is the sequence's log-likelihood (what preference
// objectives compare, package preference); CrossEntropy is minus its mean over the positions not ignored.
//
// Forward: mask * (picked - lse), with lse and picked as in CrossEntropy.
//
// Backward: with v = dL/d(output), d/dlogits = v * mask * (onehot(label) - softmax(logits)): the lse part as in
// CrossEntropy (logSumExp or fusedLogSumExp, which keep the logits and two [..., 1] statistics, or the
// probabilities and their maximum), the pick as a Gather whose gradient scatters v * mask into the labelled
// classes. The labels are kept too.
func TokenLogProbs(logits, labels *graph.Node, ignoreIndex int) *graph.Node {
	lse, picked, mask := labelTerms(logits, labels, ignoreIndex, "TokenLogProbs")
	return graph.Mul(graph.Sub(picked, lse), mask)
}

// labelTerms returns, for logits [..., C] and integer labels [...], lse = log(sum(exp(logits))) over the classes
// (fusedLogSumExp where the backend has a fused softmax, logSumExp otherwise), picked = logits[label] (0 where
// ignored) and mask = 1 where the label is not ignoreIndex, 0 where it is (in the logits' dtype). It panics with
// who's name on logits or labels of the wrong kind.
func labelTerms(logits, labels *graph.Node, ignoreIndex int, who string) (lse, picked, mask *graph.Node) {
	if logits.Rank() < 1 || !logits.DType().IsFloat() {
		panic(fmt.Sprintf("loss.%s: logits must be float [..., classes], got %s", who, logits.Shape()))
	}
	lead := logits.Shape().Dimensions[:logits.Rank()-1]
	if !labels.DType().IsInt() || !equalDims(labels.Shape().Dimensions, lead) {
		panic(fmt.Sprintf("loss.%s: labels must be integers shaped %v, got %s", who, lead, labels.Shape()))
	}
	g := logits.Graph()
	labels = graph.ConvertDType(labels, dtypes.Int32)
	if engine.Fused(logits, compute.OpTypeFusedSoftmax) {
		lse = fusedLogSumExp(logits)
	} else {
		lse = logSumExp(logits)
	}
	valid := graph.NotEqual(labels, graph.Scalar(g, dtypes.Int32, ignoreIndex))
	safe := graph.Where(valid, labels, graph.ZerosLike(labels))
	return lse, pick(logits, safe), graph.ConvertDType(valid, logits.DType())
}

// logSumExp returns log(sum(exp(logits))) over the last axis, [...]: with m = max(logits) (no gradient),
// m + log(sum(exp(logits - m))).
//
// Backward: d lse / d logits = softmax(logits) = exp(logits - m) / s with s = sum(exp(logits - m)); GoMLX's log
// and sum gradients already supply dL/ds = dL/dlse / s broadcast over the classes, so the exponential's VJP only
// has to multiply by exp(logits - m), which it recomputes from logits and m (behind a barrier, so that no backend
// merges it with the forward exponentials) instead of keeping the exponentials; the subtraction passes the
// result straight to logits. Kept: logits, m and s ([..., 1]).
func logSumExp(logits *graph.Node) *graph.Node {
	m := graph.StopGradient(graph.ReduceAndKeep(logits, graph.ReduceMax, -1))
	shifted := engine.PassThrough(graph.Sub(logits, m), engine.KindOther, 0)
	e := engine.SetVJP(graph.Exp(shifted), engine.KindOther, func(e, v *graph.Node) []*graph.Node {
		lm := engine.Recompute(shifted.Inputs()[0], shifted.Inputs()[1])
		return []*graph.Node{graph.Mul(v, graph.Exp(graph.Sub(lm[0], lm[1])))}
	})
	return graph.Add(graph.Squeeze(m, -1), graph.Log(graph.ReduceSum(e, -1)))
}

// fusedLogSumExp is logSumExp on a backend with a fused softmax (the pure-Go one), without any exponential of
// its own: with p = softmax(logits) (the fused op: one pass, a fast float32 exp) and m = max(logits), the largest
// probability is exp(m - lse), so lse = m - log(max(p)); max(p) >= 1/classes, so the log never underflows.
//
// Backward: d lse / d logits = p. GoMLX's gradients of the subtraction and the log hand the max-of-p node
// dL/dmax(p) = -dL/dlse / max(p), whose VJP returns -dL/dmax(p) * max(p) * p = dL/dlse * p, and the softmax node
// passes that straight to logits. Kept: p (instead of the logits: the same bytes, and nothing is recomputed) and
// max(p) ([...]).
func fusedLogSumExp(logits *graph.Node) *graph.Node {
	m := graph.StopGradient(graph.ReduceMax(logits, -1))
	p := engine.PassThrough(graph.BackendFusedSoftmax(logits, logits.Rank()-1), engine.KindOther, 0)
	pmax := engine.SetVJP(graph.ReduceMax(p, -1), engine.KindOther, func(node, v *graph.Node) []*graph.Node {
		return []*graph.Node{graph.Mul(graph.InsertAxes(graph.Neg(graph.Mul(v, node)), -1), engine.Fresh(p))}
	})
	return graph.Sub(m, graph.Log(pmax))
}

// pick returns logits[i..., labels[i...]] for every leading position i, with one Gather whose indices are the
// full coordinates (no reshape of logits, which would copy it).
func pick(logits, labels *graph.Node) *graph.Node {
	g := logits.Graph()
	lead := labels.Shape()
	coords := make([]*graph.Node, 0, lead.Rank()+1)
	for axis := 0; axis < lead.Rank(); axis++ {
		coords = append(coords, graph.InsertAxes(graph.Iota(g, lead, axis), -1))
	}
	coords = append(coords, graph.InsertAxes(labels, -1))
	return graph.Gather(logits, graph.Concatenate(coords, -1))
}

func equalDims(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Float32 returns x converted to float32 when it is a narrower float (bfloat16, float16 logits): losses are
// computed in float32. Other nodes are returned as they are.
func Float32(x *graph.Node) *graph.Node {
	if x.DType().IsFloat() && x.DType().Size() < 4 {
		return graph.ConvertDType(x, dtypes.Float32)
	}
	return x
}
