package preference_test

import (
	"math"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/preference"
)

// The plain references: the objectives of TRL's DPOTrainer and ORPOTrainer computed on the host in float64 from a
// bigram "model" (logits of position t = table[token t]), written from the formulas, not from Loss.

const vocab = 6

// pairData is a small pair batch: 3 pairs of 7 tokens, prompts of 2 to 3 tokens, padding 0 after the completion.
var pairData = struct {
	chosen, rejected             [][]int32
	chosenPrompt, rejectedPrompt []int
	chosenLen, rejectedLen       []int
}{
	chosen:         [][]int32{{1, 2, 3, 4, 5, 0, 0}, {2, 2, 5, 1, 0, 0, 0}, {3, 1, 4, 1, 5, 2, 5}},
	rejected:       [][]int32{{1, 2, 4, 4, 0, 0, 0}, {2, 2, 1, 3, 3, 5, 0}, {3, 1, 4, 2, 5, 0, 0}},
	chosenPrompt:   []int{2, 2, 3},
	rejectedPrompt: []int{2, 2, 3},
	chosenLen:      []int{5, 4, 7},
	rejectedLen:    []int{4, 6, 5},
}

// tensorsOf returns the pair batch's tensors: ids, masks and labels (ids on the completion, -100 elsewhere).
func tensorsOf() map[string]*tensors.Tensor {
	d := pairData
	mk := func(rows [][]int32, prompt, length []int) (ids, mask, labels *tensors.Tensor) {
		n, t := len(rows), len(rows[0])
		flat, m, l := make([]int32, n*t), make([]int32, n*t), make([]int32, n*t)
		for i, r := range rows {
			for j, v := range r {
				flat[i*t+j] = v
				l[i*t+j] = loss.IgnoreIndex
				if j < length[i] {
					m[i*t+j] = 1
					if j >= prompt[i] {
						l[i*t+j] = v
					}
				}
			}
		}
		return tensors.FromFlatDataAndDimensions(flat, n, t), tensors.FromFlatDataAndDimensions(m, n, t), tensors.FromFlatDataAndDimensions(l, n, t)
	}
	out := map[string]*tensors.Tensor{}
	out[preference.ChosenIDs], out[preference.ChosenMask], out[preference.ChosenLabels] = mk(d.chosen, d.chosenPrompt, d.chosenLen)
	out[preference.RejectedIDs], out[preference.RejectedMask], out[preference.RejectedLabels] = mk(d.rejected, d.rejectedPrompt, d.rejectedLen)
	return out
}

// logSoftmax returns log softmax of a row, in float64.
func logSoftmax(row []float32) []float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, float64(v))
	}
	s := 0.0
	for _, v := range row {
		s += math.Exp(float64(v) - m)
	}
	out := make([]float64, len(row))
	for i, v := range row {
		out[i] = float64(v) - m - math.Log(s)
	}
	return out
}

// seqStats returns, for one sequence under a bigram table, the sum of the completion's token log-probabilities,
// its token count, the sum of log-probabilities of every real token after the first (ORPO's NLL), their count,
// and the sum of the completion positions' logits (TRL's logits metrics) over all vocabulary entries.
func seqStats(table []float32, seq []int32, prompt, length int) (sum float64, n int, all float64, nAll int, logitSum float64) {
	for t := 1; t < length; t++ {
		row := table[int(seq[t-1])*vocab : (int(seq[t-1])+1)*vocab]
		lp := logSoftmax(row)[seq[t]]
		all += lp
		nAll++
		if t >= prompt {
			sum += lp
			n++
			for _, v := range row {
				logitSum += float64(v)
			}
		}
	}
	return
}

func logSigmoid(x float64) float64 { return -math.Log1p(math.Exp(-x)) }

// plainLoss computes an objective's loss and metrics the way TRL defines them.
func plainLoss(cfg preference.Config, policy, ref []float32) (float64, map[string]float64) {
	d := pairData
	pairs := len(d.chosen)
	avg := cfg.Objective == preference.ORPO || cfg.Loss == preference.LossIPO
	m := map[string]float64{}
	var lossSum, nllSum float64
	var nllCount int
	var logitSumC, logitSumR float64
	var tokC, tokR int
	for i := 0; i < pairs; i++ {
		pc, nc, allC, nAllC, lsc := seqStats(policy, d.chosen[i], d.chosenPrompt[i], d.chosenLen[i])
		pr, nr, _, _, lsr := seqStats(policy, d.rejected[i], d.rejectedPrompt[i], d.rejectedLen[i])
		logitSumC, logitSumR, tokC, tokR = logitSumC+lsc, logitSumR+lsr, tokC+nc, tokR+nr
		nllSum, nllCount = nllSum-allC, nllCount+nAllC
		if avg {
			pc, pr = pc/float64(nc), pr/float64(nr)
		}
		var rc, rr float64
		if cfg.Objective == preference.DPO {
			rc, _, _, _, _ = seqStats(ref, d.chosen[i], d.chosenPrompt[i], d.chosenLen[i])
			rr, _, _, _, _ = seqStats(ref, d.rejected[i], d.rejectedPrompt[i], d.rejectedLen[i])
			if avg {
				rc, rr = rc/float64(nc), rr/float64(nr)
			}
		}
		var l, wc, wr float64
		switch cfg.Objective {
		case preference.DPO:
			z := (pc - pr) - (rc - rr)
			if cfg.Loss == preference.LossIPO {
				l = math.Pow(z-1/(2*cfg.Beta), 2)
			} else {
				l = -logSigmoid(cfg.Beta*z)*(1-cfg.LabelSmoothing) - logSigmoid(-cfg.Beta*z)*cfg.LabelSmoothing
			}
			wc, wr = cfg.Beta*(pc-rc), cfg.Beta*(pr-rr)
		case preference.ORPO:
			log1mexp := func(x float64) float64 { return math.Log(1 - math.Exp(x)) }
			logOdds := (pc - pr) - (log1mexp(pc) - log1mexp(pr))
			l = -cfg.Lambda * logSigmoid(logOdds) // the NLL is added once below
			m["log_odds_ratio"] += logSigmoid(logOdds) / float64(pairs)
			m["log_odds_chosen"] += logOdds / float64(pairs)
			wc, wr = cfg.Lambda*pc, cfg.Lambda*pr
		}
		lossSum += l
		m["rewards/chosen"] += wc / float64(pairs)
		m["rewards/rejected"] += wr / float64(pairs)
		m["rewards/margins"] += (wc - wr) / float64(pairs)
		if wc > wr {
			m["rewards/accuracies"] += 1 / float64(pairs)
		}
		m["logps/chosen"] += pc / float64(pairs)
		m["logps/rejected"] += pr / float64(pairs)
	}
	m["logits/chosen"] = logitSumC / float64(tokC*vocab)
	m["logits/rejected"] = logitSumR / float64(tokR*vocab)
	total := lossSum / float64(pairs)
	if cfg.Objective == preference.ORPO {
		m["nll_loss"] = nllSum / float64(nllCount)
		total += m["nll_loss"]
	}
	return total, m
}

// bigram is a Logits of a bigram table [vocab, vocab]: logits[n, t] = table[ids[n, t]].
func bigram(table *graph.Node) preference.Logits {
	return func(batch map[string]*graph.Node) *graph.Node {
		ids := graph.ConvertDType(batch["input_ids"], dtypes.Int32)
		return graph.Gather(table, graph.InsertAxes(ids, -1))
	}
}

// runLoss builds the objective's loss, metrics and gradient with respect to the policy table; withRef also
// feeds precomputed reference log-likelihoods (from the reference table, in plain float64) instead of the
// reference pass.
func runLoss(t *testing.T, cfg preference.Config, policy, ref []float32, precomputed bool) (float64, []float64, []float32) {
	in := tensorsOf()
	names := append(preference.Inputs(), "policy", "ref")
	inputs := []*tensors.Tensor{}
	for _, n := range preference.Inputs() {
		inputs = append(inputs, in[n])
	}
	inputs = append(inputs, gtest.Tensor(policy, vocab, vocab), gtest.Tensor(ref, vocab, vocab))
	if precomputed {
		d := pairData
		var rc, rr []float32
		for i := range d.chosen {
			c, _, _, _, _ := seqStats(ref, d.chosen[i], d.chosenPrompt[i], d.chosenLen[i])
			r, _, _, _, _ := seqStats(ref, d.rejected[i], d.rejectedPrompt[i], d.rejectedLen[i])
			rc, rr = append(rc, float32(c)), append(rr, float32(r))
		}
		names = append(names, preference.RefChosen, preference.RefRejected)
		inputs = append(inputs, gtest.Tensor(rc, len(rc)), gtest.Tensor(rr, len(rr)))
	}
	out := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		batch := map[string]*graph.Node{}
		for i, n := range names {
			batch[n] = p[i]
		}
		var reference preference.Logits
		if !precomputed {
			reference = bigram(batch["ref"])
		}
		l, metrics := preference.Loss(cfg, bigram(batch["policy"]), reference, batch)
		outs := append([]*graph.Node{l}, metrics...)
		return append(outs, engine.Gradient(l, batch["policy"])...)
	}, inputs...)
	var metrics []float64
	for _, m := range out[1 : len(out)-1] {
		metrics = append(metrics, float64(m[0]))
	}
	return float64(out[0][0]), metrics, out[len(out)-1]
}

func TestLossMatchesTRLFormulas(t *testing.T) {
	policy, ref := gtest.Rand(11, vocab*vocab, 1), gtest.Rand(12, vocab*vocab, 1)
	// A confident policy: the data's own bigrams have high logits, so some mean log-likelihoods lie above
	// -ln 2 (log1mexp's other branch).
	confident := append([]float32(nil), policy...)
	for _, rows := range [][][]int32{pairData.chosen, pairData.rejected} {
		for _, r := range rows {
			for j := 1; j < len(r); j++ {
				confident[int(r[j-1])*vocab+int(r[j])] = 6
			}
		}
	}
	for _, tc := range []struct {
		name        string
		cfg         preference.Config
		precomputed bool
		confident   bool
	}{
		{"dpo sigmoid", preference.Config{Objective: preference.DPO, Beta: 0.1, Loss: preference.LossSigmoid}, false, false},
		{"dpo sigmoid precomputed", preference.Config{Objective: preference.DPO, Beta: 0.1, Loss: preference.LossSigmoid}, true, false},
		{"dpo label smoothing", preference.Config{Objective: preference.DPO, Beta: 0.5, Loss: preference.LossSigmoid, LabelSmoothing: 0.2}, false, false},
		{"ipo", preference.Config{Objective: preference.DPO, Beta: 0.3, Loss: preference.LossIPO}, false, false},
		{"ipo precomputed", preference.Config{Objective: preference.DPO, Beta: 0.3, Loss: preference.LossIPO}, true, false},
		{"orpo", preference.Config{Objective: preference.ORPO, Lambda: 0.25}, false, false},
		{"orpo confident", preference.Config{Objective: preference.ORPO, Lambda: 0.25}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			policy := policy
			if tc.confident {
				policy = confident
			}
			wantLoss, wantMetrics := plainLoss(tc.cfg, policy, ref)
			gotLoss, gotMetrics, grad := runLoss(t, tc.cfg, policy, ref, tc.precomputed)
			if math.Abs(gotLoss-wantLoss) > 1e-5 {
				t.Errorf("loss %.7g, want %.7g", gotLoss, wantLoss)
			}
			names := preference.Metrics(tc.cfg.Objective)
			if len(gotMetrics) != len(names) {
				t.Fatalf("%d metrics, want %d (%v)", len(gotMetrics), len(names), names)
			}
			for i, n := range names {
				if math.Abs(gotMetrics[i]-wantMetrics[n]) > 1e-5 {
					t.Errorf("%s = %.7g, want %.7g", n, gotMetrics[i], wantMetrics[n])
				}
			}
			// The gradient against central differences of the plain loss (float64).
			const h = 1e-4
			for _, i := range []int{1*vocab + 2, 2*vocab + 5, 3*vocab + 4, 4*vocab + 1, 0} {
				up, down := append([]float32(nil), policy...), append([]float32(nil), policy...)
				up[i] += h
				down[i] -= h
				lu, _ := plainLoss(tc.cfg, up, ref)
				ld, _ := plainLoss(tc.cfg, down, ref)
				want := (lu - ld) / (2 * h)
				if math.Abs(float64(grad[i])-want) > 2e-3*math.Max(1, math.Abs(want)) {
					t.Errorf("d loss / d table[%d] = %.6g, want %.6g (central difference)", i, grad[i], want)
				}
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []preference.Config{
		{Objective: "kto"},
		{Objective: preference.DPO, Beta: 0, Loss: preference.LossSigmoid},
		{Objective: preference.DPO, Beta: 0.1, Loss: "hinge"},
		{Objective: preference.DPO, Beta: 0.1, Loss: preference.LossSigmoid, LabelSmoothing: 0.5},
		{Objective: preference.DPO, Beta: 0.1, Loss: preference.LossIPO, LabelSmoothing: 0.1},
		{Objective: preference.ORPO, Lambda: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
