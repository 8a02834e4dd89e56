package finetune

import (
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
	"github.com/memfit/memfit/runner"
)

// The host-side step: the way memfit ran a step before the device-resident one (issue 16), kept here, in the
// tests, as the reference the device-resident step is held to (TestDeviceStepMatchesHostStep). One program per
// micro-batch returns the loss and every gradient to the host, Go code averages them, and a second program
// uploads them again for the optimizer update; it gives the same numbers as the device-resident step, slower.

// HostStep runs a trainer's optimizer steps the host-side way (exported to the package's external tests). It
// reads and replaces the trainer's tensors, optimizer state, RNG and Mesa states and step count, as the
// device-resident step does.
type HostStep struct {
	t         *Trainer
	gradSteps map[string]*gradStep
	update    *updateStep
}

// NewHostStep returns the host-side step of t.
func NewHostStep(t *Trainer) *HostStep { return &HostStep{t: t, gradSteps: map[string]*gradStep{}} }

// TrainStep runs one optimizer step over the micro-batches the host-side way; its stats are complete (synced).
func (h *HostStep) TrainStep(batches []Batch) (StepStats, error) {
	if len(batches) == 0 {
		return StepStats{}, fmt.Errorf("no batches for the step")
	}
	if c, ok := h.t.Model.(runner.BatchChecker); ok {
		for _, b := range batches {
			if err := c.CheckBatch(b); err != nil {
				return StepStats{}, fmt.Errorf("batch for step %d: %w", h.t.Step+1, err)
			}
		}
	}
	return h.hostTrainStep(batches)
}

// Release frees the host-side step's compiled programs.
func (h *HostStep) Release() {
	for _, gs := range h.gradSteps {
		gs.g.Finalize()
	}
	if h.update != nil {
		h.update.g.Finalize()
	}
	h.gradSteps, h.update = nil, nil
}

// gradStep is a compiled gradient computation for one batch signature.
type gradStep struct {
	g           *graph.Graph
	outputs     []*graph.Node
	batchNames  []string
	frozenNames []string
	trainNames  []string
	saved       *memory.SavedReport
	peak        *memory.Peak
	mesa        int // Mesa states among the parameters and outputs
}

// gradFor returns the compiled gradient step for the batch's shapes, building it on first use.
func (h *HostStep) gradFor(b Batch) (*gradStep, error) {
	t := h.t
	sig := batchSignature(b)
	if gs, ok := h.gradSteps[sig]; ok {
		return gs, nil
	}
	for _, name := range t.Model.BatchInputs() {
		if _, ok := b[name]; !ok {
			return nil, fmt.Errorf("batch has no %q (the model needs %v)", name, t.Model.BatchInputs())
		}
	}
	gs := &gradStep{batchNames: sortedKeys(b), frozenNames: t.Frozen.Names(), trainNames: t.Train.Names()}
	var err error
	var mesaShapes []shapes.Shape
	if gs.g, gs.outputs, mesaShapes, err = buildGradStep(t.Backend, t.stepSpec(b)); err != nil {
		return nil, err
	}
	if err := t.initMesa(mesaShapes); err != nil {
		return nil, err
	}
	gs.mesa = len(mesaShapes)
	saved, err := memory.Saved(gs.g, gs.outputs...)
	if err != nil {
		return nil, err
	}
	gs.saved = saved
	h.gradSteps[sig] = gs
	return gs, nil
}

// runGrad runs the gradient step on b and returns the loss and the gradients by trainable name.
func (h *HostStep) runGrad(gs *gradStep, b Batch) (float64, map[string]*tensors.Tensor, error) {
	t := h.t
	args := make([]any, 0, len(gs.batchNames)+len(gs.frozenNames)+len(gs.trainNames)+1)
	for _, n := range gs.batchNames {
		args = append(args, b[n])
	}
	args = append(args, t.RNG)
	for _, n := range gs.frozenNames {
		args = append(args, t.Frozen[n])
	}
	for _, n := range gs.trainNames {
		args = append(args, t.Train[n])
	}
	for _, m := range t.Mesa {
		args = append(args, m)
	}
	var outs []*tensors.Tensor
	run := func() error {
		return engine.Try(func() { outs = gs.g.Run(args...) })
	}
	var err error
	if gs.peak == nil {
		p, perr := memory.MeasurePeak(gs.g, func() error { err = run(); return err })
		if err == nil {
			if perr != nil { // the step ran; only its peak is unknown
				p = memory.UnavailablePeak(perr)
			}
			gs.peak = &p
		}
	} else {
		err = run()
	}
	if err != nil {
		return 0, nil, err
	}
	lossT := outs[0]
	var loss float64
	lossT.MustConstFlatData(func(f any) { loss = float64(f.([]float32)[0]) })
	lossT.MustFinalizeAll()
	grads := map[string]*tensors.Tensor{}
	for i, n := range gs.trainNames {
		grads[n] = outs[1+i]
	}
	t.RNG = outs[len(outs)-1-gs.mesa]
	if gs.mesa > 0 {
		t.Mesa = outs[len(outs)-gs.mesa:]
	}
	return loss, grads, nil
}

// hostTrainStep is TrainStep's step: the gradients of each micro-batch come back to the host, are averaged
// there and go up again to the update program.
func (h *HostStep) hostTrainStep(batches []Batch) (StepStats, error) {
	t := h.t
	start := time.Now()
	stats := StepStats{Step: t.Step + 1, LR: t.Config.LearningRate(t.Step)}
	var acc map[string][]float32
	for _, b := range batches {
		gs, err := h.gradFor(b)
		if err != nil {
			return stats, err
		}
		loss, grads, err := h.runGrad(gs, b)
		if err != nil {
			return stats, err
		}
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			freeAll(grads)
			return stats, t.nonFiniteError(stats.Step, stats.LR, fmt.Sprintf("loss %v", loss))
		}
		stats.Loss += loss / float64(len(batches))
		stats.Examples += b.Size()
		stats.Tokens += tokens(b)
		stats.SavedActivationBytes = max(stats.SavedActivationBytes, gs.saved.Total)
		if gs.peak != nil {
			stats.PeakBytes, stats.PeakMethod = memory.LargerPeak(stats.PeakBytes, stats.PeakMethod, gs.peak.Bytes, string(gs.peak.Method))
		}
		if acc == nil {
			acc = map[string][]float32{}
		}
		for n, g := range grads {
			tensors.MustConstFlatData[float32](g, func(f []float32) {
				if acc[n] == nil {
					acc[n] = make([]float32, len(f))
				}
				for i, v := range f {
					acc[n][i] += v / float32(len(batches))
				}
			})
			g.MustFinalizeAll()
		}
	}
	norm, err := h.applyUpdate(acc, stats.LR)
	if err != nil {
		return stats, err
	}
	stats.GradNorm, stats.Synced = norm, true
	stats.setSeconds(time.Since(start).Seconds())
	return stats, nil
}

// updateStep is the compiled optimizer update.
type updateStep struct {
	g     *graph.Graph
	names []string
}

// buildUpdate compiles the optimizer update for the trainable tensors of the given shapes. Inputs: lr, the two
// bias corrections (AdamW: 1 - beta1^t, 1 - beta2^t), then per tensor (sorted by name) the parameter, its
// averaged gradient and its state; outputs: the new parameters, the new state and the gradient's global norm.
// Clipping and the update are clipScale and optimizerStep, as in the device-resident step.
func buildUpdate(backend compute.Backend, cfg Config, train map[string]shapes.Shape) (*updateStep, error) {
	u := &updateStep{names: sortedKeys(train)}
	err := engine.Try(func() {
		g := graph.NewGraph(backend, "optimizer-update")
		scalar := func(name string) *graph.Node { return graph.Parameter(g, name, shapes.Make(dtypes.Float32)) }
		lr, bc1, bc2 := scalar("lr"), scalar("bias_correction1"), scalar("bias_correction2")
		type slot struct{ p, g, m, v *graph.Node }
		slots := make([]slot, len(u.names))
		for i, n := range u.names {
			s := train[n]
			slots[i].p = graph.Parameter(g, n, s)
			slots[i].g = graph.Parameter(g, "grad."+n, s)
			slots[i].m = graph.Parameter(g, "m."+n, s)
			if cfg.Optimizer == "adamw" {
				slots[i].v = graph.Parameter(g, "v."+n, s)
			}
		}
		grads := make([]*graph.Node, len(slots))
		for i, s := range slots {
			grads[i] = s.g
		}
		norm, scale := clipScale(cfg, grads)
		var newP, newM, newV []*graph.Node
		for _, s := range slots {
			np, nm, nv := optimizerStep(cfg, s.p, graph.Mul(s.g, scale), s.m, s.v, lr, bc1, bc2)
			newP, newM = append(newP, np), append(newM, nm)
			if nv != nil {
				newV = append(newV, nv)
			}
		}
		outputs := append(append(append(newP, newM...), newV...), norm)
		if err := g.Compile(outputs...); err != nil {
			panic(err) // engine.Try returns it
		}
		u.g = g
	})
	if err != nil {
		return nil, fmt.Errorf("building the optimizer update: %w", err)
	}
	return u, nil
}

// applyUpdate runs the optimizer on the averaged gradients and replaces the trainable tensors and the state.
// It returns the gradient norm (before clipping). A non-finite gradient norm changes nothing.
func (h *HostStep) applyUpdate(grads map[string][]float32, lr float64) (float64, error) {
	t := h.t
	if h.update == nil {
		var err error
		if h.update, err = buildUpdate(t.Backend, t.Config, t.stepSpec(nil).train); err != nil {
			return 0, err
		}
	}
	cfg := t.Config
	step := float64(t.Step + 1)
	bc1 := 1 - math.Pow(cfg.Beta1, step)
	bc2 := 1 - math.Pow(cfg.Beta2, step)
	if cfg.Optimizer != "adamw" {
		bc1, bc2 = 1, 1
	}
	args := []any{float32(lr), float32(bc1), float32(bc2)}
	for _, n := range h.update.names {
		g, ok := grads[n]
		if !ok {
			return 0, fmt.Errorf("no gradient for %q", n)
		}
		args = append(args, t.Train[n], tensors.FromFlatDataAndDimensions(g, t.Train[n].Shape().Dimensions...), t.M[n])
		if cfg.Optimizer == "adamw" {
			args = append(args, t.V[n])
		}
	}
	var outs []*tensors.Tensor
	if err := engine.Try(func() { outs = h.update.g.Run(args...) }); err != nil {
		return 0, err
	}
	k := len(h.update.names)
	var norm float64
	outs[len(outs)-1].MustConstFlatData(func(f any) { norm = float64(f.([]float32)[0]) })
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		for _, o := range outs {
			o.MustFinalizeAll()
		}
		return norm, t.nonFiniteError(t.Step+1, lr, fmt.Sprintf("gradient norm %v", norm))
	}
	for i, n := range h.update.names {
		t.Train[n] = outs[i]
		t.M[n] = outs[k+i]
		if cfg.Optimizer == "adamw" {
			t.V[n] = outs[2*k+i]
		}
	}
	outs[len(outs)-1].MustFinalizeAll()
	t.Step++
	return norm, nil
}

func freeAll(ts map[string]*tensors.Tensor) {
	for _, t := range ts {
		t.MustFinalizeAll()
	}
}
