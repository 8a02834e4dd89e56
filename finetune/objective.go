package finetune

// The training objective (Config.Objective): the model's own loss, or a preference objective of package
// preference (DPO, ORPO) on pair batches. This file holds what the trainer and the planner need of it: the
// config's settings, the reference model's tensors and how a step's graph binds them, the metrics a step
// returns, and the checks of pair batches. The pair data is read in pairs.go, the reference log-likelihoods
// precomputed in precompute.go.

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"strings"
	"time"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/preference"
	"github.com/memfit/memfit/runner"
)

// Preference returns the preference objective of c (ok false for the model's own loss).
func (c Config) Preference() (p preference.Config, ok bool) {
	if c.Objective == "" {
		return preference.Config{}, false
	}
	return preference.Config{Objective: c.Objective, Beta: c.DPOBeta, Loss: c.DPOLoss,
		LabelSmoothing: c.DPOLabelSmoothing, Lambda: c.ORPOLambda}, true
}

// checkObjective returns what is wrong with c's objective settings ("" for nothing).
func (c Config) checkObjective() string {
	p, ok := c.Preference()
	dpoSet := c.DPOBeta != 0 || c.DPOLoss != "" || c.DPOLabelSmoothing != 0
	switch {
	case !ok && (dpoSet || c.ORPOLambda != 0 || c.PrecomputeRef):
		return "dpo_beta, dpo_loss, dpo_label_smoothing, orpo_lambda and precompute_ref go with objective dpo or orpo: leave them out, or give the objective"
	case !ok:
		return ""
	case c.Objective == preference.ORPO && (dpoSet || c.PrecomputeRef):
		return "dpo_beta, dpo_loss, dpo_label_smoothing and precompute_ref are DPO's: ORPO has no reference model (its weight is orpo_lambda)"
	case c.Objective == preference.DPO && c.ORPOLambda != 0:
		return "orpo_lambda is ORPO's: DPO's strength is dpo_beta"
	}
	if err := p.Validate(); err != nil {
		return err.Error()
	}
	return ""
}

// objectiveDefaults gives the settings of cfg's objective that neither the config file nor a flag gave (given)
// TRL's defaults: DPO beta 0.1 and the sigmoid loss, ORPO lambda 0.1.
func objectiveDefaults(cfg Config, given func(key string) bool) Config {
	switch cfg.Objective {
	case preference.DPO:
		if !given("dpo_beta") {
			cfg.DPOBeta = 0.1
		}
		if !given("dpo_loss") {
			cfg.DPOLoss = preference.LossSigmoid
		}
	case preference.ORPO:
		if !given("orpo_lambda") {
			cfg.ORPOLambda = 0.1
		}
	}
	return cfg
}

// PreferenceDefaults returns cfg training with a preference objective (preference.DPO or preference.ORPO) and
// its settings at TRL's defaults, for Go callers (the CLI's Resolve sets them the same way).
func PreferenceDefaults(cfg Config, objective string) Config {
	cfg.Objective = objective
	cfg.DPOBeta, cfg.DPOLoss, cfg.DPOLabelSmoothing, cfg.ORPOLambda = 0, "", 0, 0
	return objectiveDefaults(cfg, func(string) bool { return false })
}

// refPrefix names the reference model's copy of a trained tensor in a step's graph: "ref." + its name.
const refPrefix = "ref."

// reference says how a step of a DPO run computes the reference model, the policy as it starts: names are the
// trained tensors whose starting values the step keeps as frozen copies (refPrefix + name), and adapters whether
// the reference applies the adapters (false: it runs the base alone, the adapters switched off).
type reference struct {
	names    []string
	adapters bool
}

// referenceOf returns the reference of a run of cfg that trains the tensors train (sorted) with the adapters of
// set (nil without): none without DPO, or with precomputed reference log-likelihoods (the batch carries them).
// Fresh LoRA adapters compute nothing at the start (B = 0), so the reference is the same base weights with the
// adapters off: no copy of the base, only of the base tensors a LoRA run trains too (train_modules). A run from
// an init_adapter keeps a frozen copy of the adapter's trained tensors and applies it; full fine-tuning keeps a
// frozen copy of every trained tensor (the planner counts it, as the step's frozen tensors); custom adapters,
// whose start may not be the identity, are copied as the init adapter.
func referenceOf(cfg Config, train []string, set *adapter.Set) reference {
	if cfg.Objective != preference.DPO || cfg.PrecomputeRef {
		return reference{}
	}
	fresh := set != nil && cfg.InitAdapter == "" && cfg.Method != MethodCustom
	var ref reference
	for _, n := range train {
		if fresh {
			if _, isAdapter := set.Params[n]; isAdapter {
				continue
			}
		}
		ref.names = append(ref.names, n)
	}
	ref.adapters = set != nil && !fresh
	return ref
}

// objectiveLoss builds the step's loss and metrics (none for the model's own loss) over the bound model and the
// batch: spec.model.Loss, or for a preference objective preference.Loss with the policy's logits (the bound
// model) and, for DPO without precomputed log-likelihoods, the reference's (referenceBound).
func objectiveLoss(spec stepSpec, bound models.Bound, batch map[string]*graph.Node) (*graph.Node, []*graph.Node) {
	p, ok := spec.config.Preference()
	if !ok {
		return spec.model.Loss(bound, batch), nil
	}
	policy := func(in map[string]*graph.Node) *graph.Node { return spec.model.Logits(bound, in) }
	var refLogits preference.Logits
	if p.UsesReference() && batch[preference.RefChosen] == nil {
		rb := referenceBound(bound, spec.reference, spec.adapters)
		refLogits = func(in map[string]*graph.Node) *graph.Node { return spec.model.Logits(rb, in) }
	}
	return preference.Loss(p, policy, refLogits, batch)
}

// referenceBound returns the policy's bound model b as the reference model sees it: the frozen copies (refPrefix)
// in place of the trained tensors of ref, the adapters applied only when ref says so, and no training: no
// dropout, no Mesa storage (nothing of the reference pass is kept for a backward pass).
func referenceBound(b models.Bound, ref reference, set *adapter.Set) models.Bound {
	nodes := make(map[string]*graph.Node, len(b.Nodes))
	for n, v := range b.Nodes {
		nodes[n] = v
	}
	for _, n := range ref.names {
		if v := b.Nodes[refPrefix+n]; v != nil {
			nodes[n] = v
		} else {
			panic(fmt.Sprintf("finetune: the reference's copy of %q is not bound", n))
		}
	}
	out := models.Bound{Names: b.Names, Nodes: nodes, Weights: b.Weights}
	if ref.adapters && set != nil {
		out.Linear = set.Hook()
	}
	return out
}

// isPairBatch reports whether b is a batch of preference pairs.
func isPairBatch(b Batch) bool { return b[preference.ChosenIDs] != nil }

// modelInputs are a causal language model's batch tensors, and pairNames the pair batch's tensors that hold
// them for the chosen and for the rejected completions, in the same order.
var (
	modelInputs = [3]string{"input_ids", "attention_mask", "labels"}
	pairNames   = [2][3]string{{preference.ChosenIDs, preference.ChosenMask, preference.ChosenLabels},
		{preference.RejectedIDs, preference.RejectedMask, preference.RejectedLabels}}
)

// pairHalves returns a pair batch's chosen and rejected sequences as two batches of the model's inputs
// (input_ids, attention_mask, labels), for the model's own checks.
func pairHalves(b Batch) [2]Batch {
	var out [2]Batch
	for i, side := range pairNames {
		out[i] = Batch{}
		for j, n := range modelInputs {
			out[i][n] = b[side[j]]
		}
	}
	return out
}

// checkModelBatch runs the model's own batch check (runner.BatchChecker) on b, or on each half of a pair batch.
func checkModelBatch(check func(Batch) error, b Batch) error {
	if !isPairBatch(b) {
		return check(b)
	}
	for i, half := range pairHalves(b) {
		if err := check(half); err != nil {
			return fmt.Errorf("the %s completions: %w", [2]string{"chosen", "rejected"}[i], err)
		}
	}
	return nil
}

// metricsOf returns the names of the metrics a step of cfg returns beside its loss (nil for the model's own
// loss).
func metricsOf(cfg Config) []string {
	if p, ok := cfg.Preference(); ok {
		return preference.Metrics(p.Objective)
	}
	return nil
}

// stackMetrics returns the metrics as one float32 vector [M] (nil for none).
func stackMetrics(metrics []*graph.Node) *graph.Node {
	if len(metrics) == 0 {
		return nil
	}
	parts := make([]*graph.Node, len(metrics))
	for i, m := range metrics {
		parts[i] = graph.Reshape(preferenceF32(m), 1)
	}
	return graph.Concatenate(parts, 0)
}

// metricValues reads a stacked metrics vector into a map by name (nil for none).
func metricValues(names []string, v *tensors.Tensor) map[string]float64 {
	if len(names) == 0 || v == nil {
		return nil
	}
	out := map[string]float64{}
	v.MustConstFlatData(func(f any) {
		if vals, ok := f.([]float32); ok {
			for i, n := range names {
				if i < len(vals) {
					out[n] = float64(vals[i])
				}
			}
		}
	})
	return out
}

// initReference makes the frozen copies of the reference's trained tensors (refPrefix + name, in the compute
// dtype: no copy at all where the start already is in it) from their starting values in t.Train, and keeps
// those starting values for validation, which runs in float32.
func (t *Trainer) initReference() error {
	t.ref = referenceOf(t.Config, sortedKeys(t.Train), t.Adapters)
	t.refStart = models.Params{}
	for _, n := range t.ref.names {
		p, err := convert(t.Train[n], t.computeDType())
		if err != nil {
			return fmt.Errorf("the reference's copy of %q: %w", n, err)
		}
		t.Frozen[refPrefix+n] = p
		t.refStart[refPrefix+n] = t.Train[n]
	}
	return nil
}

// isReferenceTensor reports whether a frozen tensor's name is the reference's copy of a trained one.
func isReferenceTensor(name string) bool { return strings.HasPrefix(name, refPrefix) }

// referenceShapes adds the shapes of the reference's copies to a step spec's frozen tensors (the planner's
// spec, which has no tensors).
func referenceShapes(spec *stepSpec) {
	spec.reference = referenceOf(spec.config, sortedKeys(spec.train), spec.adapters)
	for _, n := range spec.reference.names {
		spec.frozen[refPrefix+n] = shapes.Make(spec.compute, spec.train[n].Dimensions...)
	}
}

// pairTokens counts the real tokens of a pair batch (chosen and rejected).
func pairTokens(b Batch) int {
	n := 0
	for _, h := range pairHalves(b) {
		n += tokens(Batch{"attention_mask": h["attention_mask"]})
	}
	return n
}

// isReferenceInput reports whether a batch input is a precomputed reference log-likelihood, which stays float32
// in a bfloat16 step (a sum of hundreds of token log-probabilities has no bits to spare).
func isReferenceInput(name string) bool {
	return name == preference.RefChosen || name == preference.RefRejected
}

// withMetrics returns the JSON object of v (a struct) with the metrics added as keys of their own, as TRL logs
// them beside the loss ("rewards/chosen": ...), prefixed by prefix ("eval_" for validation).
func withMetrics(v any, metrics map[string]float64, prefix string) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil || len(metrics) == 0 {
		return raw, err
	}
	obj := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	for n, x := range metrics {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			obj[prefix+n] = json.RawMessage(fmt.Sprintf("%q", fmt.Sprint(x)))
			continue
		}
		b, _ := json.Marshal(x)
		obj[prefix+n] = b
	}
	return json.Marshal(obj)
}

// MarshalJSON writes the step's fields and, as keys of their own, its Metrics.
func (s StepStats) MarshalJSON() ([]byte, error) {
	type plain StepStats // without this method
	return withMetrics(plain(s), s.Metrics, "")
}

// evaluatePairs is Evaluate for a preference objective: its loss and metrics over every pair of set, each the
// mean over the pairs (batch means weighted by their sizes), with the current weights and, for DPO, the
// reference (the frozen copies' starting values, or the base with the adapters off).
func (t *Trainer) evaluatePairs(set EvalSet, start time.Time) (EvalStats, error) {
	names := metricsOf(t.Config)
	if t.evalRunner == nil {
		spec := stepSpec{model: t.Model, adapters: t.Adapters, config: t.Config, reference: t.ref}
		t.evalRunner = runner.NewOutputsRunner(t.Backend, t.Model, func(b models.Bound, batch map[string]*graph.Node) []*graph.Node {
			l, metrics := objectiveLoss(spec, b, batch)
			return []*graph.Node{preferenceF32(l), stackMetrics(metrics)}
		})
	}
	current, adapters := t.Current()
	params := models.Params{}
	maps.Copy(params, current)
	maps.Copy(params, t.refStart)
	var sum float64
	sums := make([]float64, len(names))
	n := 0
	err := set.Batches(max(1, t.Config.BatchSize), func(b Batch, first int) error {
		outs, err := t.evalRunner.Run(params, adapters, b)
		if err != nil {
			return fmt.Errorf("validation pairs %d to %d: %w", first, first+b.Size()-1, err)
		}
		defer func() {
			for _, o := range outs {
				o.MustFinalizeAll()
			}
		}()
		size := float64(b.Size())
		sum += scalar(outs[0]) * size
		m := metricValues(names, outs[1])
		for i, name := range names {
			sums[i] += m[name] * size
		}
		n += b.Size()
		return nil
	})
	if err != nil {
		return EvalStats{}, err
	}
	if n == 0 {
		return EvalStats{}, fmt.Errorf("the validation set has no pairs")
	}
	s := EvalStats{Kind: "eval", Step: t.Step, Loss: sum / float64(n), Examples: set.Len(),
		Seconds: time.Since(start).Seconds(), Metrics: map[string]float64{}}
	for i, name := range names {
		s.Metrics[name] = sums[i] / float64(n)
	}
	return s, nil
}

// batchInputs lists the batch tensors a step of cfg on model reads: the model's own, or a pair batch's.
func batchInputs(model Model, cfg Config) []string {
	if _, ok := cfg.Preference(); ok {
		return preference.Inputs()
	}
	return model.BatchInputs()
}

// StepBatchShapes returns the shapes of the batch a step of cfg on model takes at shape in: the family's batch
// (Family.BatchShapes), or for a preference objective a pair batch of in.Batch pairs of in.Seq tokens (chosen
// and rejected each shaped as the family's causal-LM batch, plus the precomputed reference log-likelihoods [B]
// with precompute_ref). The planner builds its steps from them.
func StepBatchShapes(model Model, cfg Config, in Shape) (map[string]shapes.Shape, error) {
	fam, ok := FamilyOf(model)
	if !ok || fam.BatchShapes == nil {
		return nil, fmt.Errorf("memory planning does not know model %T", model)
	}
	if _, pref := cfg.Preference(); pref && in.Packed {
		return nil, fmt.Errorf("preference pairs are not packed: plan them without --packing")
	}
	own, err := fam.BatchShapes(model, in)
	if err != nil {
		return nil, err
	}
	if _, pref := cfg.Preference(); !pref {
		return own, nil
	}
	if model.Task() != "CAUSAL_LM" {
		what := familyTitle(model)
		if model.Task() != "" {
			what += " with the task " + model.Task()
		}
		return nil, fmt.Errorf("objective %s trains a causal language model; %s", cfg.Objective, what)
	}
	out := map[string]shapes.Shape{}
	for _, side := range pairNames {
		for j, n := range modelInputs {
			s, ok := own[n]
			if !ok {
				return nil, fmt.Errorf("model %T's batch has no %s", model, n)
			}
			out[side[j]] = s
		}
	}
	if cfg.PrecomputeRef {
		out[preference.RefChosen] = shapes.Make(dtypes.Float32, in.Batch)
		out[preference.RefRejected] = shapes.Make(dtypes.Float32, in.Batch)
	}
	return out, nil
}

// StepRandomBatch makes one batch of random inputs for a step of cfg on model at shape in (calibration: step
// times do not depend on the values): RandomBatch, or for a preference objective a pair of them (with random
// reference log-likelihoods for precompute_ref); nil for a model whose family makes none.
func StepRandomBatch(model Model, cfg Config, in Shape, seed uint64) Batch {
	if _, pref := cfg.Preference(); !pref {
		return RandomBatch(model, in, seed)
	}
	c, r := RandomBatch(model, in, seed), RandomBatch(model, in, seed+1)
	if c == nil || r == nil {
		return nil
	}
	b := Batch{}
	for i, half := range []Batch{c, r} {
		for j, n := range modelInputs {
			b[pairNames[i][j]] = half[n]
		}
	}
	if cfg.PrecomputeRef {
		lp := make([]float32, in.Batch)
		for i := range lp {
			lp[i] = -float32(in.Seq) * 5 // any value: times do not depend on it
		}
		b[preference.RefChosen] = tensors.FromFlatDataAndDimensions(lp, in.Batch)
		b[preference.RefRejected] = tensors.FromFlatDataAndDimensions(append([]float32(nil), lp...), in.Batch)
	}
	return b
}

// preferenceF32 returns x in float32 (a loss or metric of a bfloat16 step).
func preferenceF32(x *graph.Node) *graph.Node {
	if x.DType() != dtypes.Float32 {
		return graph.ConvertDType(x, dtypes.Float32)
	}
	return x
}
