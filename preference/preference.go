// Package preference holds the preference-tuning objectives memfit trains with, DPO and ORPO, as graph builders
// over a causal language model's logits: the sequence log-likelihoods of a chosen and a rejected completion of
// one prompt, the losses and the metrics TRL (Hugging Face's DPOTrainer and ORPOTrainer) logs. It also turns
// preference rows into the token tensors the objectives read (pairs.go). The trainer (package finetune) calls
// Loss in its training step and its validation.
//
// What is matched with TRL, and where it is defined there (huggingface/trl, read at v0.23.0 for DPOTrainer and at
// the 2026 main branch for the experimental ORPOTrainer):
//
//   - the batch: chosen and rejected stacked along the batch axis and run through the policy in one pass
//     (DPOTrainer.concatenated_forward, ORPOTrainer.concatenated_forward);
//   - a completion's log-likelihood: the sum over its tokens (EOS included) of log softmax(logits[t-1])[token t],
//     prompt and padding masked (DPOTrainer.concatenated_forward: per_token_logps summed over loss_mask); IPO and
//     ORPO take the mean over the completion's tokens instead (DPOTrainer: "ipo" divides by loss_mask.sum;
//     ORPOTrainer.get_batch_logps with average_log_prob=True);
//   - DPO's losses (DPOTrainer.dpo_loss): with z = (pi_c - pi_r) - (ref_c - ref_r), "sigmoid"
//     -(1-eps) log sigma(beta z) - eps log sigma(-beta z), and "ipo" (z - 1/(2 beta))^2; rewards
//     beta (pi - ref), detached;
//   - ORPO's loss (ORPOTrainer.odds_ratio_loss and get_batch_loss_metrics): the chosen completions' NLL (the mean
//     cross entropy over every non-padding token of prompt + chosen, as TRL computes it) minus lambda times the
//     mean of log sigma(log odds ratio); rewards lambda times the mean log-likelihoods;
//   - the metrics (DPOTrainer/ORPOTrainer.get_batch_loss_metrics): rewards/chosen, rewards/rejected,
//     rewards/accuracies (chosen reward strictly above rejected), rewards/margins, logps/chosen, logps/rejected,
//     logits/chosen and logits/rejected (the mean logit over the completions' positions), and for ORPO nll_loss,
//     log_odds_ratio and log_odds_chosen; each a mean over the batch's pairs.
//
// One difference: TRL's ORPOTrainer averages logits/chosen and logits/rejected over every position of the padded
// batch (prompt and padding included), which depends on how a batch is padded; memfit averages over the
// completion's positions for ORPO too, as DPOTrainer does.
package preference

import (
	"fmt"
	"math"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/loss"
)

// Objectives.
const (
	// DPO is Direct Preference Optimization (Rafailov et al. 2023): the policy's log-likelihood ratios to a
	// frozen reference, chosen against rejected.
	DPO = "dpo"
	// ORPO is Odds Ratio Preference Optimization (Hong et al. 2024): reference-free, the SFT loss on the chosen
	// completions plus an odds-ratio term.
	ORPO = "orpo"
)

// DPO loss types (Config.Loss).
const (
	// LossSigmoid is the DPO paper's loss, -log sigma(beta z), with optional label smoothing (conservative DPO).
	LossSigmoid = "sigmoid"
	// LossIPO is IPO's squared loss (Azar et al. 2023) on per-token mean log-likelihoods, (z - 1/(2 beta))^2.
	LossIPO = "ipo"
)

// Config is a preference objective and its settings.
type Config struct {
	// Objective is DPO or ORPO.
	Objective string
	// Beta is DPO's temperature: how far the policy may move from the reference (TRL's beta, default 0.1).
	Beta float64
	// Loss is DPO's loss type: LossSigmoid or LossIPO.
	Loss string
	// LabelSmoothing is the probability that a pair's preference is flipped (conservative DPO, sigmoid loss
	// only), in [0, 0.5).
	LabelSmoothing float64
	// Lambda weighs ORPO's odds-ratio term against the SFT loss (TRL ORPOConfig's beta, the paper's lambda,
	// default 0.1).
	Lambda float64
}

// Validate checks the settings; the messages name them by their config keys (dpo_beta: the flag --dpo-beta).
func (c Config) Validate() error {
	switch c.Objective {
	case DPO:
		if !(c.Beta > 0) || math.IsInf(c.Beta, 0) {
			return fmt.Errorf("dpo_beta must be positive, got %g", c.Beta)
		}
		switch c.Loss {
		case LossSigmoid:
		case LossIPO:
			if c.LabelSmoothing != 0 {
				return fmt.Errorf("dpo_label_smoothing applies to the sigmoid loss, not ipo: leave it out")
			}
		default:
			return fmt.Errorf("dpo_loss must be %s or %s, got %q", LossSigmoid, LossIPO, c.Loss)
		}
		if !(c.LabelSmoothing >= 0 && c.LabelSmoothing < 0.5) {
			return fmt.Errorf("dpo_label_smoothing is the probability that a preference is flipped: it must be in [0, 0.5), got %g", c.LabelSmoothing)
		}
	case ORPO:
		if !(c.Lambda >= 0) || math.IsInf(c.Lambda, 0) {
			return fmt.Errorf("orpo_lambda must not be negative, got %g", c.Lambda)
		}
	default:
		hint := ""
		switch strings.ToLower(c.Objective) {
		case "ipo":
			hint = ": IPO is a DPO loss (objective dpo, dpo_loss ipo)"
		case "sft":
			hint = ": supervised fine-tuning is the default (leave the objective out)"
		}
		return fmt.Errorf("objective must be %s or %s, got %q%s", DPO, ORPO, c.Objective, hint)
	}
	return nil
}

// UsesReference reports whether the objective compares with a reference model (DPO; ORPO has none).
func (c Config) UsesReference() bool { return c.Objective == DPO }

// Names of a pair batch's tensors: for the chosen and the rejected completion of each pair, its tokens (prompt,
// then completion) [B, T], the attention mask [B, T] and the labels [B, T] (the token ids on the completion's
// tokens, loss.IgnoreIndex on the prompt and the padding); with precomputed reference log-likelihoods
// (RefChosen, RefRejected [B] float32: sums over the completion's tokens) the reference pass is skipped.
const (
	ChosenIDs      = "chosen_input_ids"
	ChosenMask     = "chosen_attention_mask"
	ChosenLabels   = "chosen_labels"
	RejectedIDs    = "rejected_input_ids"
	RejectedMask   = "rejected_attention_mask"
	RejectedLabels = "rejected_labels"
	RefChosen      = "ref_chosen_logps"
	RefRejected    = "ref_rejected_logps"
)

// Inputs lists a pair batch's tensors, sorted (without the optional reference log-likelihoods).
func Inputs() []string {
	return []string{ChosenMask, ChosenIDs, ChosenLabels, RejectedMask, RejectedIDs, RejectedLabels}
}

// Metrics lists the metrics Loss returns for an objective, in order, under the names TRL logs them with.
func Metrics(objective string) []string {
	names := []string{"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
		"logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected"}
	if objective == ORPO {
		names = append(names, "nll_loss", "log_odds_ratio", "log_odds_chosen")
	}
	return names
}

// Logits builds a causal language model's logits [N, T, vocab] for a batch of "input_ids" and "attention_mask"
// [N, T].
type Logits func(batch map[string]*graph.Node) *graph.Node

// Loss builds the objective's mean loss over the pairs of batch (the tensors named above) and its metrics
// (Metrics, in order), float32 scalars. policy runs the trained model, once, on the chosen and rejected
// completions stacked along the batch axis; reference runs the frozen reference model the same way for DPO when
// the batch carries no precomputed RefChosen and RefRejected (nil is allowed otherwise). The reference pass is
// built first and under StopGradient: no gradient flows into it, so the backward pass keeps none of its
// activations, and on a backend that runs ops in creation order its temporaries are freed before the policy's
// activations are held.
func Loss(cfg Config, policy, reference Logits, batch map[string]*graph.Node) (lossNode *graph.Node, metrics []*graph.Node) {
	for _, name := range Inputs() {
		if batch[name] == nil {
			panic(fmt.Sprintf("preference.Loss: the batch has no %q", name))
		}
	}
	ids := graph.Concatenate([]*graph.Node{batch[ChosenIDs], batch[RejectedIDs]}, 0)
	mask := graph.Concatenate([]*graph.Node{batch[ChosenMask], batch[RejectedMask]}, 0)
	labels := graph.Concatenate([]*graph.Node{batch[ChosenLabels], batch[RejectedLabels]}, 0)
	pairs := batch[ChosenIDs].Shape().Dim(0)
	in := map[string]*graph.Node{"input_ids": ids, "attention_mask": mask}
	average := cfg.Objective == ORPO || cfg.Loss == LossIPO
	completion := completionMask(labels)
	tokens := graph.ReduceSum(completion, -1) // [2B]

	var refC, refR *graph.Node
	if cfg.UsesReference() {
		var ref *graph.Node // [2B]: sums of the reference's log-likelihoods over each completion
		if batch[RefChosen] != nil && batch[RefRejected] != nil {
			ref = graph.Concatenate([]*graph.Node{f32(batch[RefChosen]), f32(batch[RefRejected])}, 0)
		} else {
			if reference == nil {
				panic("preference.Loss: DPO needs a reference model or precomputed reference log-likelihoods")
			}
			ref = graph.StopGradient(SequenceLogProbs(f32(reference(in)), labels))
		}
		if average {
			ref = graph.Div(ref, tokens)
		}
		refC, refR = engine.SliceAxis(ref, 0, 0, pairs), engine.SliceAxis(ref, 0, pairs, 2*pairs)
	}

	logits := f32(policy(in))
	meanLogits := completionMeanLogits(logits, completion, pairs)
	var lp *graph.Node // [2B, T-1]: log-likelihood of each next token (of every real token for ORPO's NLL)
	if cfg.Objective == ORPO {
		lp = loss.TokenLogProbs(dropLast(logits), realTokens(ids, mask), loss.IgnoreIndex)
	} else {
		lp = loss.TokenLogProbs(dropLast(logits), dropFirst(labels), loss.IgnoreIndex)
	}
	seq := graph.ReduceSum(graph.Mul(lp, completion), -1) // [2B]
	if average {
		seq = graph.Div(seq, tokens)
	}
	pc, pr := engine.SliceAxis(seq, 0, 0, pairs), engine.SliceAxis(seq, 0, pairs, 2*pairs)

	var losses, rewardC, rewardR *graph.Node // [B]
	var extra []*graph.Node
	switch cfg.Objective {
	case DPO:
		losses = dpoLosses(cfg, graph.Sub(graph.Sub(pc, pr), graph.Sub(refC, refR)))
		rewardC = graph.MulScalar(graph.StopGradient(graph.Sub(pc, refC)), cfg.Beta)
		rewardR = graph.MulScalar(graph.StopGradient(graph.Sub(pr, refR)), cfg.Beta)
		lossNode = graph.ReduceAllMean(losses)
	case ORPO:
		// The NLL of the chosen completions as TRL's ORPOTrainer computes it: the mean cross entropy over every
		// real token of prompt + chosen (the first excepted: nothing predicts it).
		chosenLP := engine.SliceAxis(lp, 0, 0, pairs)
		realChosen := graph.ConvertDType(engine.SliceAxis(dropFirst(mask), 0, 0, pairs), dtypes.Float32)
		nll := graph.Div(graph.Neg(graph.ReduceAllSum(chosenLP)), graph.StopGradient(graph.Max(graph.ReduceAllSum(realChosen), one(lp))))
		logOdds, ratio := orpoTerms(pc, pr)
		lossNode = graph.Sub(nll, graph.MulScalar(graph.ReduceAllMean(ratio), cfg.Lambda))
		rewardC = graph.MulScalar(graph.StopGradient(pc), cfg.Lambda)
		rewardR = graph.MulScalar(graph.StopGradient(pr), cfg.Lambda)
		extra = []*graph.Node{graph.StopGradient(nll), graph.StopGradient(graph.ReduceAllMean(ratio)), graph.StopGradient(graph.ReduceAllMean(logOdds))}
	default:
		panic(fmt.Sprintf("preference.Loss: unknown objective %q", cfg.Objective))
	}
	accuracy := graph.ConvertDType(graph.GreaterThan(rewardC, rewardR), dtypes.Float32)
	metrics = []*graph.Node{
		graph.ReduceAllMean(rewardC), graph.ReduceAllMean(rewardR), graph.ReduceAllMean(accuracy),
		graph.ReduceAllMean(graph.Sub(rewardC, rewardR)),
		graph.StopGradient(graph.ReduceAllMean(pc)), graph.StopGradient(graph.ReduceAllMean(pr)),
		meanLogits[0], meanLogits[1],
	}
	return lossNode, append(metrics, extra...)
}

// dpoLosses returns DPO's per-pair losses of z = (pi_c - pi_r) - (ref_c - ref_r), the policy's log-likelihood
// ratio margin over the reference's (TRL DPOTrainer.dpo_loss):
//
//	sigmoid: l = -(1-eps) log sigma(beta z) - eps log sigma(-beta z) = (1-eps) softplus(-beta z) + eps softplus(beta z)
//	ipo:     l = (z - 1/(2 beta))^2
//
// using log sigma(x) = -softplus(-x), with softplus(x) = log(1 + e^x) computed stably (GoMLX's LogAddExp with 0).
// Their gradients are GoMLX's own: dl/dz = -beta ((1-eps) sigma(-beta z) - eps sigma(beta z)) for sigmoid, and
// 2 (z - 1/(2 beta)) for ipo; z's gradient reaches the policy through pi_c and pi_r only (the reference's are
// constants).
func dpoLosses(cfg Config, z *graph.Node) *graph.Node {
	switch cfg.Loss {
	case LossIPO:
		d := graph.AddScalar(z, -1/(2*cfg.Beta))
		return graph.Mul(d, d)
	default:
		bz := graph.MulScalar(z, cfg.Beta)
		l := graph.MulScalar(graph.Softplus(graph.Neg(bz)), 1-cfg.LabelSmoothing)
		if cfg.LabelSmoothing > 0 {
			l = graph.Add(l, graph.MulScalar(graph.Softplus(bz), cfg.LabelSmoothing))
		}
		return l
	}
}

// orpoTerms returns ORPO's log odds ratio of the chosen over the rejected completion and its log sigmoid, per
// pair, from their mean log-likelihoods x_c, x_r (each <= 0: the log of a geometric-mean token probability p).
// The odds of p are p / (1 - p), so (TRL ORPOTrainer.odds_ratio_loss, the paper's eqs. 4 and 7)
//
//	log odds ratio = log(odds_c / odds_r) = (x_c - x_r) - (log(1 - e^x_c) - log(1 - e^x_r))
//
// with log(1 - e^x) = log1mexp(x). Gradients are GoMLX's own (see log1mexp).
func orpoTerms(xc, xr *graph.Node) (logOdds, ratio *graph.Node) {
	logOdds = graph.Sub(graph.Sub(xc, xr), graph.Sub(log1mexp(xc), log1mexp(xr)))
	return logOdds, graph.Neg(graph.Softplus(graph.Neg(logOdds)))
}

// log1mexp returns log(1 - e^x) for x <= 0, stably (Maechler 2012, as TRL's ORPOTrainer): log1p(-e^x) below
// -ln 2, log(-expm1(x)) from -ln 2 on. Each branch reads its input clamped to its own side of -ln 2, so the
// branch Where drops never sees an argument whose gradient is infinite (a NaN would leak through the Where's zero
// mask). d/dx log(1 - e^x) = -e^x / (1 - e^x) on both branches; GoMLX gives Expm1 no gradient, so it gets
// d/dx (e^x - 1) = e^x = expm1(x) + 1 (computed from its own output).
func log1mexp(x *graph.Node) *graph.Node {
	t := graph.Scalar(x.Graph(), x.DType(), -math.Ln2)
	low := graph.Log1p(graph.Neg(graph.Exp(graph.Min(x, t))))
	em1 := engine.SetVJP(graph.Expm1(graph.Max(x, t)), engine.KindOther, func(node, v *graph.Node) []*graph.Node {
		return []*graph.Node{graph.Mul(v, graph.AddScalar(node, 1))}
	})
	high := graph.Log(graph.Neg(em1))
	return graph.Where(graph.LessThan(x, t), low, high)
}

// SequenceLogProbs returns the log-likelihood of each sequence's target tokens under a causal language model's
// logits [N, T, vocab]: the sum over t >= 1 of log softmax(logits[t-1])[labels[t]] where labels[t] is not
// loss.IgnoreIndex, [N] float32. (Position t - 1 predicts token t, so the first position is never a target.)
func SequenceLogProbs(logits, labels *graph.Node) *graph.Node {
	return graph.ReduceSum(loss.TokenLogProbs(dropLast(f32(logits)), dropFirst(labels), loss.IgnoreIndex), -1)
}

// dropLast drops the last position (axis 1) of x [N, T, ...]: of logits, the positions 0 .. T-2 that predict
// tokens 1 .. T-1.
func dropLast(x *graph.Node) *graph.Node {
	n := x.Shape().Dim(1)
	return engine.SliceAxis(x, 1, 0, n-1)
}

// dropFirst drops the first position (axis 1) of x [N, T]: of labels, the targets of positions 0 .. T-2.
func dropFirst(x *graph.Node) *graph.Node {
	n := x.Shape().Dim(1)
	return engine.SliceAxis(x, 1, 1, n)
}

// completionMask returns 1 where labels[t+1] is a target (a completion token), 0 elsewhere: [N, T-1] float32,
// aligned with dropLast(logits).
func completionMask(labels *graph.Node) *graph.Node {
	next := dropFirst(labels)
	ignore := graph.Scalar(next.Graph(), next.DType(), loss.IgnoreIndex)
	return graph.ConvertDType(graph.NotEqual(next, ignore), dtypes.Float32)
}

// realTokens returns the next tokens [N, T-1] of every real (unpadded) position, loss.IgnoreIndex on padding:
// ORPO's NLL targets, the prompt included.
func realTokens(ids, mask *graph.Node) *graph.Node {
	next, m := dropFirst(graph.ConvertDType(ids, dtypes.Int32)), dropFirst(mask)
	real := graph.NotEqual(m, graph.ZerosLike(m))
	return graph.Where(real, next, graph.Scalar(next.Graph(), dtypes.Int32, loss.IgnoreIndex))
}

// completionMeanLogits returns the mean logit over the chosen and over the rejected completions' positions (each
// position's whole row of vocabulary logits, as TRL's logits/chosen and logits/rejected), without gradient.
func completionMeanLogits(logits, completion *graph.Node, pairs int) [2]*graph.Node {
	vocab := float64(logits.Shape().Dim(2))
	// Summed over the vocabulary first ([2B, T]) and shifted after: slicing the logits would copy them.
	rowSums := dropLast(graph.StopGradient(graph.ReduceSum(logits, -1))) // [2B, T-1]
	var out [2]*graph.Node
	for i := range out {
		m := engine.SliceAxis(completion, 0, i*pairs, (i+1)*pairs)
		s := graph.ReduceAllSum(graph.Mul(engine.SliceAxis(rowSums, 0, i*pairs, (i+1)*pairs), m))
		n := graph.MulScalar(graph.Max(graph.ReduceAllSum(m), one(m)), vocab)
		out[i] = graph.Div(s, n)
	}
	return out
}

// f32 returns x in float32 (logits of a bfloat16 model, precomputed log-likelihoods).
func f32(x *graph.Node) *graph.Node {
	if x.DType() != dtypes.Float32 {
		return graph.ConvertDType(x, dtypes.Float32)
	}
	return x
}

func one(x *graph.Node) *graph.Node { return graph.ScalarOne(x.Graph(), x.DType()) }
