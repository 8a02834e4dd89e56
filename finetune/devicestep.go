package finetune

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
)

// The device-resident training step.
//
// An optimizer step over K micro-batches runs K compiled programs and nothing else: the trainable tensors, the
// optimizer moments, the gradient accumulators and the random-number state stay on the backend as buffers from
// one program to the next (donated to it once the trainer owns them, so the backend can update them in place),
// and nothing is read back to the host. With K = 1 a step is one program: forward, backward, clipping and the
// update. With K > 1 the first micro-batch's program starts the accumulators (its gradient over K), the middle
// ones add theirs, and the last one adds its own and updates.
//
// The loss and the gradient norm stay on the backend too, until Sync reads them (Fit does at its logging,
// checkpoint and last steps). A non-finite loss or gradient norm must still stop the run with the parameters as
// they were before the offending step, although the host learns of it only later: every final program carries a
// boolean "ok" state, ok' = ok && isfinite(loss) && isfinite(norm), and writes the updated parameters and moments
// only where ok' holds (Where(ok', new, old)), so once a step fails every later step leaves them alone. Sync
// reads ok; if it is false it reads the pending steps' losses and norms to name the first that failed, and the
// trainer's step count goes back to the step before it.

// programKind says which part of an optimizer step a compiled program runs.
type programKind int

const (
	// progFinal runs the last (or only) micro-batch of a step: its gradient, the accumulation, clipping and
	// the optimizer update.
	progFinal programKind = iota
	// progFirst runs the first of several micro-batches: it starts the accumulators.
	progFirst
	// progMid runs a middle micro-batch: it adds its gradient to the accumulators.
	progMid
)

func (k programKind) String() string {
	return [...]string{"final", "first", "mid"}[k]
}

// stepProgram is one compiled program of the device-resident step, for one batch signature.
type stepProgram struct {
	kind  programKind
	accum int // micro-batches per step (K)
	g     *graph.Graph
	// gradOutputs are the gradient computation's results (loss, gradients, RNG, Mesa states), which
	// memory.Saved walks back from: the update and accumulation read only gradients and parameters, so the
	// saved activations are the gradient step's, exactly.
	gradOutputs []*graph.Node
	batchNames  []string
	frozenNames []string
	trainNames  []string
	mesa        int
	metrics     int  // the objective's metrics, stacked (0: none)
	accIn       bool // takes the accumulators and the accumulated loss (and metrics)
	saved       *memory.SavedReport
	peak        *memory.Peak
	peakDonated bool // peak was taken on a run that donated the trainer's state
	// compileSeconds is the time taken to build and compile the program.
	compileSeconds float64
}

// buildStepProgram builds and compiles one program of the device-resident step.
//
// Parameters, in order: those of buildGrad (batch, RNG, frozen, trainable, Mesa states); with accIn the
// accumulators ("acc.<name>", float32, sorted by trainable name), the accumulated loss ("loss_acc") and, when the
// objective has metrics, the accumulated metrics ("metrics_acc" [M]); for
// progFinal then the first moments ("m.<name>"), the second moments ("v.<name>", AdamW only), "ok" (bool
// scalar), "lr", "bias_correction1" and "bias_correction2" (float32 scalars).
//
// Outputs: progFirst and progMid return the accumulators, the accumulated loss, the next RNG state, the
// Mesa states and the accumulated metrics (if any); progFinal returns the new trainable tensors, the new first
// moments, the new second moments (AdamW), the next RNG state, the Mesa states, ok', the step's loss (mean over
// its micro-batches), the gradient's global norm before clipping and the step's metrics (mean over its
// micro-batches; if any).
//
// With K micro-batches each gradient g_k and loss l_k enters as g_k / K and l_k / K, so the step sees the mean
// gradient and mean loss, as torch does when each micro-batch's loss is divided by K. Clipping and the update
// are clipScale and optimizerStep.
func buildStepProgram(backend compute.Backend, cfg Config, spec stepSpec, kind programKind, accum int) (*stepProgram, []shapes.Shape, error) {
	if err := checkBatch(spec); err != nil {
		return nil, nil, err
	}
	sp := &stepProgram{kind: kind, accum: accum, accIn: accum > 1 && kind != progFirst,
		batchNames: sortedKeys(spec.batch), frozenNames: sortedKeys(spec.frozen), trainNames: sortedKeys(spec.train)}
	var mesaShapes []shapes.Shape
	start := time.Now()
	err := engine.Try(func() {
		g := graph.NewGraph(backend, "train-step-"+kind.String())
		p := buildGrad(g, spec)
		sp.gradOutputs = p.outputs()
		mesaShapes = p.mesaShapes
		f32 := func(name string) *graph.Node { return graph.Parameter(g, name, shapes.Make(dtypes.Float32)) }
		total := make([]*graph.Node, len(p.grads))
		loss, metrics := p.loss, p.metrics
		for i, gr := range p.grads {
			total[i] = gr
			if accum > 1 {
				total[i] = graph.DivScalar(gr, float64(accum))
			}
		}
		if accum > 1 {
			loss = graph.DivScalar(loss, float64(accum))
			if metrics != nil {
				metrics = graph.DivScalar(metrics, float64(accum))
			}
		}
		if sp.accIn {
			for i, n := range sp.trainNames {
				total[i] = graph.Add(graph.Parameter(g, "acc."+n, spec.train[n]), total[i])
			}
			loss = graph.Add(f32("loss_acc"), loss)
			if metrics != nil {
				metrics = graph.Add(graph.Parameter(g, "metrics_acc", metrics.Shape()), metrics)
			}
		}
		var extra []*graph.Node
		if metrics != nil {
			sp.metrics = metrics.Shape().Size()
			extra = []*graph.Node{metrics}
		}
		if kind != progFinal {
			outs := append(append(append(append(total, loss), p.rng), p.mesaOut...), extra...)
			if err := g.Compile(outs...); err != nil {
				panic(err) // engine.Try returns it: the backend's cause, not a later "not compiled"
			}
			sp.g = g
			return
		}
		ms := make([]*graph.Node, len(sp.trainNames))
		vs := make([]*graph.Node, len(sp.trainNames))
		for i, n := range sp.trainNames {
			ms[i] = graph.Parameter(g, "m."+n, spec.train[n])
		}
		if cfg.Optimizer == "adamw" {
			for i, n := range sp.trainNames {
				vs[i] = graph.Parameter(g, "v."+n, spec.train[n])
			}
		}
		ok := graph.Parameter(g, "ok", shapes.Make(dtypes.Bool))
		lr, bc1, bc2 := f32("lr"), f32("bias_correction1"), f32("bias_correction2")

		norm, scale := clipScale(cfg, total)
		okOut := graph.LogicalAnd(ok, graph.LogicalAnd(graph.IsFinite(loss), graph.IsFinite(norm)))
		keep := func(updated, old *graph.Node) *graph.Node { return graph.Where(okOut, updated, old) }
		var newP, newM, newV []*graph.Node
		for i, x := range total {
			np, nm, nv := optimizerStep(cfg, p.train[i], graph.Mul(x, scale), ms[i], vs[i], lr, bc1, bc2)
			newP, newM = append(newP, keep(np, p.train[i])), append(newM, keep(nm, ms[i]))
			if nv != nil {
				newV = append(newV, keep(nv, vs[i]))
			}
		}
		outs := append(append(append(newP, newM...), newV...), p.rng)
		outs = append(append(append(outs, p.mesaOut...), okOut, loss, norm), extra...)
		if err := g.Compile(outs...); err != nil {
			panic(err)
		}
		sp.g = g
	})
	if err != nil {
		return nil, nil, fmt.Errorf("building the training step: %w", err)
	}
	sp.compileSeconds = time.Since(start).Seconds()
	sp.mesa = len(mesaShapes)
	saved, err := memory.Saved(sp.g, sp.gradOutputs...)
	if err != nil {
		return nil, nil, err
	}
	sp.saved = saved
	return sp, mesaShapes, nil
}

// clipScale returns the global norm n = sqrt(sum of every squared gradient) of grads and the factor they are
// scaled by: with c = ClipNorm > 0, min(1, c / (n + 1e-6)) (as torch.nn.utils.clip_grad_norm_), else 1.
func clipScale(cfg Config, grads []*graph.Node) (norm, scale *graph.Node) {
	var sq *graph.Node
	for _, x := range grads {
		s := graph.ReduceAllSum(graph.Square(x))
		if sq == nil {
			sq = s
		} else {
			sq = graph.Add(sq, s)
		}
	}
	norm = graph.Sqrt(sq)
	scale = graph.ScalarOne(norm.Graph(), dtypes.Float32)
	if cfg.ClipNorm > 0 {
		scale = graph.Min(scale, graph.Div(graph.Scalar(norm.Graph(), dtypes.Float32, cfg.ClipNorm), graph.AddScalar(norm, 1e-6)))
	}
	return norm, scale
}

// optimizerStep returns one tensor's new value p', first moment m' and second moment v' (nil for SGD) from its
// value p, its (clipped) gradient g, its state m and v (v unused by SGD), the learning rate and AdamW's bias
// corrections bc1 = 1 - b1^t and bc2 = 1 - b2^t.
//
// AdamW (decoupled weight decay, as torch.optim.AdamW):
//
//	m' = b1 m + (1 - b1) g,  v' = b2 v + (1 - b2) g²,  p' = p (1 - lr wd) - lr (m' / bc1) / (sqrt(v' / bc2) + eps)
//
// SGD (as torch.optim.SGD, weight decay added to the gradient): g = g + wd p, m' = momentum m + g (m' = g when
// momentum is 0), p' = p - lr m'.
func optimizerStep(cfg Config, p, g, m, v, lr, bc1, bc2 *graph.Node) (np, nm, nv *graph.Node) {
	switch cfg.Optimizer {
	case "adamw":
		nm = graph.Add(graph.MulScalar(m, cfg.Beta1), graph.MulScalar(g, 1-cfg.Beta1))
		nv = graph.Add(graph.MulScalar(v, cfg.Beta2), graph.MulScalar(graph.Square(g), 1-cfg.Beta2))
		denom := graph.AddScalar(graph.Sqrt(graph.Div(nv, bc2)), cfg.Eps)
		dir := graph.Div(graph.Div(nm, bc1), denom)
		decayed := p
		if cfg.WeightDecay > 0 {
			decayed = graph.Mul(p, graph.OneMinus(graph.MulScalar(lr, cfg.WeightDecay)))
		}
		return graph.Sub(decayed, graph.Mul(lr, dir)), nm, nv
	case "sgd":
		if cfg.WeightDecay > 0 {
			g = graph.Add(g, graph.MulScalar(p, cfg.WeightDecay))
		}
		nm = g
		if cfg.Momentum > 0 {
			nm = graph.Add(graph.MulScalar(m, cfg.Momentum), g)
		}
		return graph.Sub(p, graph.Mul(lr, nm)), nm, nil
	}
	panic(fmt.Errorf("unknown optimizer %q", cfg.Optimizer))
}

// programKey names a compiled program: batch signature, kind and micro-batches per step.
func programKey(b Batch, kind programKind, accum int) string {
	return fmt.Sprintf("%s|%s|%d", batchSignature(b), kind, accum)
}

// programFor returns the compiled program of the given kind for the batch's shapes, building it on first use;
// compiled reports whether this call built it (and how long it took).
func (t *Trainer) programFor(b Batch, kind programKind, accum int) (*stepProgram, error) {
	key := programKey(b, kind, accum)
	if sp, ok := t.programs[key]; ok {
		return sp, nil
	}
	spec := t.stepSpec(b)
	sp, mesaShapes, err := buildStepProgram(t.Backend, t.Config, spec, kind, accum)
	if err != nil {
		return nil, err
	}
	if err := t.initMesa(mesaShapes); err != nil {
		return nil, err
	}
	t.programs[key] = sp
	t.Compiles++
	t.compileSeconds += sp.compileSeconds
	return sp, nil
}

// stepSpec is the spec of the training step for b's shapes.
func (t *Trainer) stepSpec(b Batch) stepSpec {
	spec := stepSpec{model: t.Model, adapters: t.Adapters, compute: t.computeDType(),
		batch: map[string]shapes.Shape{}, frozen: map[string]shapes.Shape{}, train: map[string]shapes.Shape{}}
	for n, v := range b {
		spec.batch[n] = v.Shape()
	}
	for n, v := range t.Frozen {
		spec.frozen[n] = v.Shape()
	}
	for n, v := range t.Train {
		spec.train[n] = v.Shape()
	}
	spec.mesa, _ = quant.ParseMesa(t.Config.Mesa)
	spec.blockMesa = usesBlockMesa(t.Model)
	spec.config, spec.reference = t.Config, t.ref
	return spec
}

// initMesa creates the Mesa range states on the first build (zero: not initialised; the first batch sets the
// ranges) and checks a later build against them.
func (t *Trainer) initMesa(mesaShapes []shapes.Shape) error {
	if t.Mesa == nil && len(mesaShapes) > 0 {
		for _, s := range mesaShapes {
			t.Mesa = append(t.Mesa, tensors.FromShape(s))
		}
	}
	if len(mesaShapes) != len(t.Mesa) {
		return fmt.Errorf("the step has %d Mesa states, the trainer %d", len(mesaShapes), len(t.Mesa))
	}
	return nil
}

// pendingStep is a step whose loss and gradient norm are still on the backend.
type pendingStep struct {
	step       int
	lr         float64
	loss, norm *tensors.Tensor
	metrics    *tensors.Tensor // the objective's metrics, stacked (nil: none)
}

// args collects a program's inputs; a tensor the trainer owns (an output of an earlier program, held nowhere
// else) is donated, so the backend may reuse its buffer for the program's outputs.
type args struct {
	t      *Trainer
	vals   []any
	donate []bool
	err    error
}

func (a *args) add(x any) {
	a.vals = append(a.vals, x)
	a.donate = append(a.donate, false)
}

func (a *args) own(x *tensors.Tensor) {
	if _, ok := a.t.owned[x]; !ok || a.err != nil {
		a.add(x)
		return
	}
	delete(a.t.owned, x)
	d, err := graph.DonateTensorBuffer(x, a.t.Backend, 0)
	if err != nil {
		a.err = err
		a.add(x)
		return
	}
	a.vals = append(a.vals, d)
	a.donate = append(a.donate, true)
}

// adopt records outputs of a program as the trainer's own (donated to a later program).
func (t *Trainer) adopt(ts ...*tensors.Tensor) {
	for _, x := range ts {
		t.owned[x] = struct{}{}
	}
}

// run executes sp on a, measuring its peak on its first run and again on its first run that donates.
func (t *Trainer) run(sp *stepProgram, a *args) ([]*tensors.Tensor, error) {
	if a.err != nil {
		return nil, a.err
	}
	var outs []*tensors.Tensor
	run := func() error { return engine.Try(func() { outs = sp.g.Run(a.vals...) }) }
	donating := false
	for _, d := range a.donate {
		donating = donating || d
	}
	if sp.peak == nil || (donating && !sp.peakDonated) {
		var runErr error
		p, err := memory.MeasurePeakDonating(sp.g, a.donate, func() error { runErr = run(); return runErr })
		if runErr != nil {
			return nil, runErr
		}
		if err != nil {
			// The step ran; only its peak is unknown (a backend the measurement does not know): train on.
			p = memory.UnavailablePeak(err)
		}
		sp.peak, sp.peakDonated = &p, donating
		return outs, nil
	}
	return outs, run()
}

// deviceStep runs one optimizer step as the device-resident programs and returns without reading anything
// back: the step's loss and gradient norm are left pending for Sync.
func (t *Trainer) deviceStep(batches []Batch, stats *StepStats) error {
	k := len(batches)
	var acc []*tensors.Tensor
	var lossAcc, metricsAcc *tensors.Tensor
	for i, b := range batches {
		kind := progMid
		switch {
		case i == k-1:
			kind = progFinal
		case i == 0:
			kind = progFirst
		}
		sp, err := t.programFor(b, kind, k)
		if err != nil {
			return err
		}
		a := &args{t: t}
		for _, n := range sp.batchNames {
			a.add(b[n])
		}
		a.add(t.RNG)
		for _, n := range sp.frozenNames {
			a.add(t.Frozen[n])
		}
		for _, n := range sp.trainNames {
			if kind == progFinal {
				a.own(t.Train[n])
			} else {
				a.add(t.Train[n])
			}
		}
		for _, m := range t.Mesa {
			a.add(m)
		}
		if sp.accIn {
			for _, x := range acc {
				a.own(x)
			}
			a.own(lossAcc)
			if metricsAcc != nil {
				a.own(metricsAcc)
			}
		}
		if kind == progFinal {
			for _, n := range sp.trainNames {
				a.own(t.M[n])
			}
			if t.Config.Optimizer == "adamw" {
				for _, n := range sp.trainNames {
					a.own(t.V[n])
				}
			}
			if t.ok == nil {
				t.ok = tensors.FromScalar(true)
			}
			a.own(t.ok)
			bc1, bc2 := t.biasCorrections()
			a.add(float32(stats.LR))
			a.add(float32(bc1))
			a.add(float32(bc2))
		}
		outs, err := t.run(sp, a)
		if err != nil {
			return err
		}
		stats.Examples += examples(b)
		stats.Tokens += tokens(b)
		stats.SavedActivationBytes = max(stats.SavedActivationBytes, sp.saved.Total)
		if sp.peak != nil {
			stats.PeakBytes, stats.PeakMethod = memory.LargerPeak(stats.PeakBytes, stats.PeakMethod, sp.peak.Bytes, string(sp.peak.Method))
		}
		nt := len(sp.trainNames)
		if kind != progFinal {
			acc, lossAcc = outs[:nt], outs[nt]
			t.adopt(acc...)
			t.adopt(lossAcc)
			t.RNG = outs[nt+1]
			if sp.mesa > 0 {
				t.Mesa = outs[nt+2 : nt+2+sp.mesa]
			}
			if sp.metrics > 0 {
				metricsAcc = outs[nt+2+sp.mesa]
				t.adopt(metricsAcc)
			}
			continue
		}
		j := 0
		next := func() *tensors.Tensor { j++; return outs[j-1] }
		for _, n := range sp.trainNames {
			t.Train[n] = next()
			t.adopt(t.Train[n])
		}
		for _, n := range sp.trainNames {
			t.M[n] = next()
			t.adopt(t.M[n])
		}
		if t.Config.Optimizer == "adamw" {
			for _, n := range sp.trainNames {
				t.V[n] = next()
				t.adopt(t.V[n])
			}
		}
		t.RNG = next()
		if sp.mesa > 0 {
			t.Mesa = outs[j : j+sp.mesa]
			j += sp.mesa
		}
		t.ok = next()
		t.adopt(t.ok)
		ps := pendingStep{step: stats.Step, lr: stats.LR, loss: next(), norm: next()}
		if sp.metrics > 0 {
			ps.metrics = next()
		}
		t.pending = append(t.pending, ps)
	}
	t.Step++
	return nil
}

// biasCorrections returns AdamW's 1 - beta1^t and 1 - beta2^t for the next step (1, 1 for SGD).
func (t *Trainer) biasCorrections() (float64, float64) {
	if t.Config.Optimizer != "adamw" {
		return 1, 1
	}
	step := float64(t.Step + 1)
	return 1 - math.Pow(t.Config.Beta1, step), 1 - math.Pow(t.Config.Beta2, step)
}

// scalar reads a scalar tensor (float32 or bool) from the backend as a float64 (bool: 1 or 0).
func scalar(x *tensors.Tensor) float64 {
	var v float64
	x.MustConstFlatData(func(f any) {
		switch f := f.(type) {
		case []float32:
			v = float64(f[0])
		case []bool:
			if f[0] {
				v = 1
			}
		}
	})
	return v
}

// Sync waits for the steps run so far and reads back the last one's loss and gradient norm (mean loss over
// its micro-batches; norm before clipping). When a pending step had a non-finite loss or gradient norm it
// returns an error wrapping ErrNonFinite that names the first such step; the parameters, the optimizer state
// and Step are then those from before that step (the later steps changed nothing). With nothing pending it
// returns the figures of the last synced step.
func (t *Trainer) Sync() (loss, gradNorm float64, err error) {
	if len(t.pending) == 0 {
		return t.lastLoss, t.lastNorm, nil
	}
	pending := t.pending
	t.pending = nil
	defer func() {
		for _, p := range pending {
			p.loss.MustFinalizeAll()
			p.norm.MustFinalizeAll()
			if p.metrics != nil {
				p.metrics.MustFinalizeAll()
			}
		}
	}()
	var failed error
	if err := engine.Try(func() {
		if scalar(t.ok) != 0 {
			last := pending[len(pending)-1]
			loss, gradNorm = scalar(last.loss), scalar(last.norm)
			t.lastMetrics = metricValues(metricsOf(t.Config), last.metrics)
			return
		}
		for _, p := range pending {
			l, n := scalar(p.loss), scalar(p.norm)
			if !finite(l) {
				failed = t.nonFiniteError(p.step, p.lr, fmt.Sprintf("loss %v", l))
			} else if !finite(n) {
				failed = t.nonFiniteError(p.step, p.lr, fmt.Sprintf("gradient norm %v", n))
			}
			if failed != nil {
				t.Step = p.step - 1
				return
			}
		}
		failed = fmt.Errorf("%w: a step failed but every pending loss and norm is finite", ErrNonFinite)
	}); err != nil {
		return 0, 0, err
	}
	if failed != nil {
		delete(t.owned, t.ok)
		t.ok = nil // the failed steps changed nothing: a later step starts afresh
		return 0, 0, failed
	}
	t.lastLoss, t.lastNorm = loss, gradNorm
	return loss, gradNorm, nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// nonFiniteError is the error of a step whose loss or gradient norm (what: "loss NaN", "gradient norm +Inf") is
// not finite; the trainer's tensors are those the step started from. After an update the usual cause is a
// learning rate too large; at step 1 no update has happened yet, so the learning rate cannot be the cause: the
// weights or the data are, and a weight that is not finite is named.
func (t *Trainer) nonFiniteError(step int, lr float64, what string) error {
	if step > 1 {
		return fmt.Errorf("%w at step %d (%s, lr %g): lower the learning rate or check the data", ErrNonFinite, step, what, lr)
	}
	// The tensors with a copy on the host are read (those of a model built or loaded there: the step-1 weights);
	// none is brought back from a device for this.
	var bad *models.NonFiniteError
	_ = engine.Try(func() { // a tensor no longer valid is passed over, not a panic
		for _, p := range []models.Params{t.Train, t.Frozen} {
			local := models.Params{}
			for n, x := range p {
				if x != nil && x.IsLocal() {
					local[n] = x
				}
			}
			if err := models.CheckAllFinite(local); errors.As(err, &bad) {
				return
			}
		}
	})
	if bad != nil {
		return fmt.Errorf("%w at step 1 (%s), before any update: the weights it starts from are not finite (%s): the model or adapter holds them, not the learning rate", ErrNonFinite, what, bad.Where())
	}
	return fmt.Errorf("%w at step 1 (%s), before any update, so not from the learning rate: the data (a NaN or huge value) or the model's weights (finite, but too large) give it", ErrNonFinite, what)
}
