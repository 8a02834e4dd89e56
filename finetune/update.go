package finetune

import (
	"fmt"
	"math"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
)

// updateStep is the compiled optimizer update.
type updateStep struct {
	g     *graph.Graph
	names []string
}

// buildUpdate compiles the optimizer update for the trainable tensors. Inputs: lr, the two bias corrections
// (AdamW: 1 - beta1^t, 1 - beta2^t), then per tensor (sorted by name) the parameter, its averaged gradient and
// its state; outputs: the new parameters, the new state and the gradient's global norm.
//
// Clipping: with c = ClipNorm > 0 and n = sqrt(sum of every squared gradient), gradients are scaled by
// min(1, c / (n + 1e-6)) (as torch.nn.utils.clip_grad_norm_).
//
// AdamW (decoupled weight decay, as torch.optim.AdamW):
//
//	m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g²,  p = p (1 - lr wd) - lr (m / bc1) / (sqrt(v / bc2) + eps)
//
// SGD (as torch.optim.SGD, weight decay added to the gradient): g = g + wd p, buf = momentum buf + g,
// p = p - lr buf (buf = g when momentum is 0).
func (t *Trainer) buildUpdate() (*updateStep, error) {
	cfg := t.Config
	u := &updateStep{names: t.Train.Names()}
	err := engine.Try(func() {
		g := graph.NewGraph(t.Backend, "optimizer-update")
		scalar := func(name string) *graph.Node { return graph.Parameter(g, name, shapes.Make(dtypes.Float32)) }
		lr, bc1, bc2 := scalar("lr"), scalar("bias_correction1"), scalar("bias_correction2")
		type slot struct{ p, g, m, v *graph.Node }
		slots := make([]slot, len(u.names))
		for i, n := range u.names {
			s := t.Train[n].Shape()
			slots[i].p = graph.Parameter(g, n, s)
			slots[i].g = graph.Parameter(g, "grad."+n, s)
			slots[i].m = graph.Parameter(g, "m."+n, s)
			if cfg.Optimizer == "adamw" {
				slots[i].v = graph.Parameter(g, "v."+n, s)
			}
		}
		var sq *graph.Node
		for _, s := range slots {
			x := graph.ReduceAllSum(graph.Square(s.g))
			if sq == nil {
				sq = x
			} else {
				sq = graph.Add(sq, x)
			}
		}
		norm := graph.Sqrt(sq)
		scale := graph.ScalarOne(g, dtypes.Float32)
		if cfg.ClipNorm > 0 {
			scale = graph.Min(scale, graph.Div(graph.Scalar(g, dtypes.Float32, cfg.ClipNorm), graph.AddScalar(norm, 1e-6)))
		}
		var newP, newM, newV []*graph.Node
		for _, s := range slots {
			grad := graph.Mul(s.g, scale)
			switch cfg.Optimizer {
			case "adamw":
				m := graph.Add(graph.MulScalar(s.m, cfg.Beta1), graph.MulScalar(grad, 1-cfg.Beta1))
				v := graph.Add(graph.MulScalar(s.v, cfg.Beta2), graph.MulScalar(graph.Square(grad), 1-cfg.Beta2))
				denom := graph.AddScalar(graph.Sqrt(graph.Div(v, bc2)), cfg.Eps)
				stepDir := graph.Div(graph.Div(m, bc1), denom)
				p := s.p
				if cfg.WeightDecay > 0 {
					p = graph.Mul(p, graph.OneMinus(graph.MulScalar(lr, cfg.WeightDecay)))
				}
				newP = append(newP, graph.Sub(p, graph.Mul(lr, stepDir)))
				newM = append(newM, m)
				newV = append(newV, v)
			case "sgd":
				if cfg.WeightDecay > 0 {
					grad = graph.Add(grad, graph.MulScalar(s.p, cfg.WeightDecay))
				}
				buf := grad
				if cfg.Momentum > 0 {
					buf = graph.Add(graph.MulScalar(s.m, cfg.Momentum), grad)
				}
				newP = append(newP, graph.Sub(s.p, graph.Mul(lr, buf)))
				newM = append(newM, buf)
			}
		}
		outputs := append(append(append(newP, newM...), newV...), norm)
		g.Compile(outputs...)
		u.g = g
	})
	if err != nil {
		return nil, fmt.Errorf("building the optimizer update: %w", err)
	}
	return u, nil
}

// applyUpdate runs the optimizer on the averaged gradients and replaces the trainable tensors and the state.
// It returns the gradient norm (before clipping). A non-finite gradient norm changes nothing.
func (t *Trainer) applyUpdate(grads map[string][]float32, lr float64) (float64, error) {
	if t.update == nil {
		var err error
		if t.update, err = t.buildUpdate(); err != nil {
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
	for _, n := range t.update.names {
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
	if err := engine.Try(func() { outs = t.update.g.Run(args...) }); err != nil {
		return 0, err
	}
	k := len(t.update.names)
	var norm float64
	outs[len(outs)-1].MustConstFlatData(func(f any) { norm = float64(f.([]float32)[0]) })
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		for _, o := range outs {
			o.MustFinalizeAll()
		}
		return norm, fmt.Errorf("%w: the gradient norm is %v at step %d (lr %g): lower the learning rate or check the data", ErrNonFinite, norm, t.Step+1, lr)
	}
	for i, n := range t.update.names {
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
