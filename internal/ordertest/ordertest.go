// Package ordertest checks, on the CPU and without XLA, that a model family's training steps state the order
// their memory savings need as data dependences (engine's "order is data", engine.Ties), in every memory mode:
// memory.CheckOrder on the step's graph as XLA would get it. A family adds one test calling Family with one of its
// presets (a small one); see docs/families.md.
//
// The graph XLA gets differs from the pure-Go backend's where memfit branches on the backend: the Go backend's
// fused ops (activation, softmax), its packing of activation codes and its operand transposes for the matmul
// kernels. XLAShaped wraps the Go backend so that graphs take XLA's branches, and are still built and compiled by
// the Go backend (nothing is run on it).
package ordertest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

// XLAShaped returns backend (the pure-Go one) dressed as another backend: its name is "xla-shaped", so memfit's
// builders take the branches they take on XLA (plain-op activation codes, DotGeneral operands as given), and it
// reports none of the Go backend's fused ops (activation, softmax, layer norm, attention), so the layers build
// the values from plain ops as they do on XLA. Graphs are built and compiled by the Go backend; they are for
// inspection (memory.Saved, memory.CheckOrder), not for running.
func XLAShaped(backend compute.Backend) compute.Backend { return xlaShaped{backend} }

type xlaShaped struct{ compute.Backend }

func (xlaShaped) Name() string   { return "xla-shaped" }
func (xlaShaped) String() string { return "xla-shaped" }

// Capabilities are the wrapped backend's without its fused ops.
func (b xlaShaped) Capabilities() compute.Capabilities {
	c := b.Backend.Capabilities()
	ops := make(map[compute.OpType]bool, len(c.Operations))
	for op, ok := range c.Operations {
		if !strings.HasPrefix(op.String(), "Fused") {
			ops[op] = ok
		}
	}
	c.Operations = ops
	return c
}

// Mode is one memory-saving configuration of a training step.
type Mode struct {
	Name  string
	Apply func(c finetune.Config) finetune.Config
}

// Modes are the configurations every family's steps must keep ordered: each memory mode (plain, approx-act,
// ms-norm and approx-act+ms-norm, grad-ckpt, Mesa on its own kinds and with approx-act on every kind), with
// standard and memory-efficient attention, QLoRA (plain, approx-act+ms-norm, grad-ckpt), and bfloat16 compute.
func Modes() []Mode {
	set := func(name string, f func(c *finetune.Config)) Mode {
		return Mode{Name: name, Apply: func(c finetune.Config) finetune.Config { f(&c); return c }}
	}
	variant := func(name string) Mode {
		v, err := finetune.VariantByName(name)
		if err != nil {
			panic(err)
		}
		return Mode{Name: name, Apply: v.Apply}
	}
	return []Mode{
		variant("plain"),
		variant("approx-act"),
		variant("ms-norm"),
		variant("approx-act+ms-norm"),
		variant("grad-ckpt"),
		set("approx-act+grad-ckpt", func(c *finetune.Config) { c.ApproxAct, c.GradCkpt = true, true }),
		variant("mesa"),
		variant("approx-act+mesa"),
		variant("approx-act+ms-norm+mesa-softmax"),
		set("memory-efficient", func(c *finetune.Config) { c.Attention = "memory-efficient" }),
		set("approx-act+ms-norm+memory-efficient", func(c *finetune.Config) {
			c.ApproxAct, c.MSNorm, c.Attention = true, true, "memory-efficient"
		}),
		set("grad-ckpt+memory-efficient", func(c *finetune.Config) { c.GradCkpt, c.Attention = true, "memory-efficient" }),
		set("qlora", func(c *finetune.Config) { c.Method = "qlora" }),
		set("qlora+approx-act+ms-norm", func(c *finetune.Config) { c.Method, c.ApproxAct, c.MSNorm = "qlora", true, true }),
		set("qlora+grad-ckpt", func(c *finetune.Config) { c.Method, c.GradCkpt = "qlora", true }),
		// bfloat16 compute, as the GPU runs (ViT-B/16 LoRA and LLaMA-7B QLoRA in issue 35).
		set("bfloat16+approx-act+ms-norm", func(c *finetune.Config) { c.ComputeDType, c.ApproxAct, c.MSNorm = "bfloat16", true, true }),
		set("bfloat16+qlora+approx-act+ms-norm+mesa-softmax", func(c *finetune.Config) {
			c.ComputeDType, c.Method, c.ApproxAct, c.MSNorm, c.Mesa = "bfloat16", "qlora", true, true, []string{"softmax"}
		}),
	}
}

// Step builds (and compiles, without running) the gradient step of the preset or model folder model (labels:
// the classes of a preset's classification head) in cfg at shape in, on backend.
func Step(backend compute.Backend, model string, labels int, cfg finetune.Config, in finetune.Shape) (*finetune.ShapedStep, finetune.Model, error) {
	m, params, err := plan.ShapeModel(model, cfg, labels)
	if err != nil {
		return nil, nil, err
	}
	fam, ok := finetune.FamilyOf(m)
	if !ok || fam.BatchShapes == nil {
		return nil, nil, fmt.Errorf("ordertest: %s has no family with batch shapes", model)
	}
	if !fam.Sequence {
		in.Seq = 0
	}
	batch, err := fam.BatchShapes(m, in)
	if err != nil {
		return nil, nil, err
	}
	step, err := finetune.StepShapes{Model: m, Params: params, Config: cfg, Batch: batch}.GradientStep(backend)
	return step, m, err
}

// MinBytes is the size from which CheckOrder counts a backward node as large in step: a quarter of the largest
// forward tensor whose last axis is the model's hidden size (the narrowest input of its linear layers), i.e. of
// one [tokens, hidden] activation.
func MinBytes(step *finetune.ShapedStep, m finetune.Model) (int64, error) {
	hidden := 0
	for _, l := range m.LinearLayers() {
		if hidden == 0 || l.In < hidden {
			hidden = l.In
		}
	}
	info, ok := engine.GradientInfoOf(step.Graph)
	if !ok || hidden == 0 {
		return 0, fmt.Errorf("ordertest: no gradient or no linear layer")
	}
	var most int64
	for _, n := range step.Graph.Nodes() {
		s := n.Shape()
		if n.Id() >= info.Boundary || s.IsTuple() || s.Rank() < 2 || !s.DType.IsFloat() || s.Dim(-1) != hidden {
			continue
		}
		most = max(most, int64(s.Memory()))
	}
	if most == 0 {
		return 0, fmt.Errorf("ordertest: no forward tensor of hidden size %d", hidden)
	}
	return most / 4, nil
}

// Check builds the step (see Step) and returns memory.CheckOrder's report on it.
func Check(backend compute.Backend, model string, labels int, cfg finetune.Config, in finetune.Shape) (*memory.OrderReport, error) {
	step, m, err := Step(backend, model, labels, cfg, in)
	if err != nil {
		return nil, err
	}
	defer step.Graph.Finalize()
	minBytes, err := MinBytes(step, m)
	if err != nil {
		return nil, err
	}
	return memory.CheckOrder(step.Graph, minBytes, step.Outputs...)
}

// Family checks every mode of Modes on the preset (or model folder) model with base's other settings at shape
// in: on the XLA-shaped backend the graph must pass every rule of memory.CheckOrder; on the pure-Go backend
// itself the pins and ties must be there too (its operand transposes for the matmul kernels are large backward
// nodes made from forward tensors alone, so RuleHoistable is checked on the XLA-shaped graph only). Modes a
// model cannot take (a family without an MLP activation, say) are skipped when the step cannot be built.
func Family(t *testing.T, goBackend compute.Backend, model string, labels int, base finetune.Config, in finetune.Shape) {
	t.Helper()
	if !engine.Ties() {
		t.Skipf("%s=0: ordering ties are off", engine.TiesEnv)
	}
	xla := XLAShaped(goBackend)
	for _, mode := range Modes() {
		cfg := mode.Apply(base)
		for _, b := range []compute.Backend{xla, goBackend} {
			rep, err := Check(b, model, labels, cfg, in)
			if err != nil {
				t.Errorf("%s on %s: %v", mode.Name, b.Name(), err)
				continue
			}
			for _, v := range rep.Violations {
				if b != xla && v.Rule == memory.RuleHoistable {
					continue
				}
				t.Errorf("%s %s on %s: %s: node %d %s %s: %s", model, mode.Name, b.Name(), v.Rule, v.Node, v.Op, v.Shape, v.Detail)
			}
		}
	}
}

// Inputs returns deterministic inputs for every parameter of the compiled graph g, in order: floats small and
// varied (seeded by the parameter's position), integers 1 (a valid token id, label, mask value and position),
// the RNG state from seed 1, Mesa range states zero.
func Inputs(g *graph.Graph) []*tensors.Tensor {
	var out []*tensors.Tensor
	for i := range g.NumParameters() {
		p := g.GetParameterByHandle(graph.ParameterHandle(i))
		s := p.Shape()
		if p.GetParameterName() == "rng" {
			st, _ := graph.RNGStateFromSeed(1)
			out = append(out, st)
			continue
		}
		out = append(out, fill(s, i, strings.HasPrefix(p.GetParameterName(), "mesa.")))
	}
	return out
}

func fill(s shapes.Shape, seed int, zero bool) *tensors.Tensor {
	n := s.Size()
	switch {
	case s.DType == dtypes.Float32:
		v := make([]float32, n)
		for j := range v {
			if !zero {
				v[j] = float32(((j*7919+seed*104729)%2003)-1001) / 20000
			}
		}
		return tensors.FromFlatDataAndDimensions(v, s.Dimensions...)
	case s.DType.IsFloat():
		return tensors.FromShape(s) // half precision: zeros
	}
	one := 1
	if zero {
		one = 0
	}
	return setInts(tensors.FromShape(s), one)
}

// setInts fills an integer tensor with v.
func setInts(t *tensors.Tensor, v int) *tensors.Tensor {
	switch t.DType() {
	case dtypes.Int32:
		tensors.MustMutableFlatData[int32](t, func(f []int32) { fillAll(f, int32(v)) })
	case dtypes.Int64:
		tensors.MustMutableFlatData[int64](t, func(f []int64) { fillAll(f, int64(v)) })
	case dtypes.Uint8:
		tensors.MustMutableFlatData[uint8](t, func(f []uint8) { fillAll(f, uint8(v)) })
	case dtypes.Uint32:
		tensors.MustMutableFlatData[uint32](t, func(f []uint32) { fillAll(f, uint32(v)) })
	case dtypes.Uint64:
		tensors.MustMutableFlatData[uint64](t, func(f []uint64) { fillAll(f, uint64(v)) })
	case dtypes.Bool:
		tensors.MustMutableFlatData[bool](t, func(f []bool) { fillAll(f, v != 0) })
	}
	return t
}

func fillAll[T any](f []T, v T) {
	for i := range f {
		f[i] = v
	}
}

// GoUnchanged checks that the ordering ties cost nothing on the pure-Go backend, in every mode of Modes on the
// preset (or model folder) model at shape in: with ties on and off (engine.TiesEnv) the step keeps the same saved
// activations (memory.Saved, byte for byte and by kind), has the same simulated peak above its resident inputs
// (memory.SimulatePeak) and, run once on the inputs of Inputs, returns bit-identical losses, gradients and states.
// (The resident bytes may differ by the constants of dead nodes: the old Checkpoint's gradient built a zero uint8
// scalar for its barrier's integer outputs, which the graph held though nothing read it.)
func GoUnchanged(t *testing.T, goBackend compute.Backend, model string, labels int, base finetune.Config, in finetune.Shape) {
	t.Helper()
	type result struct {
		saved   *memory.SavedReport
		peak    memory.Peak
		outputs [][]byte
	}
	build := func(cfg finetune.Config, ties string) (result, error) {
		t.Setenv(engine.TiesEnv, ties)
		step, _, err := Step(goBackend, model, labels, cfg, in)
		if err != nil {
			return result{}, err
		}
		defer step.Graph.Finalize()
		var r result
		if r.saved, err = memory.Saved(step.Graph, step.Outputs...); err != nil {
			return r, err
		}
		if r.peak, err = memory.SimulatePeak(step.Graph, memory.SimOptions{}); err != nil {
			return r, err
		}
		var outs []*tensors.Tensor
		if err := engine.Try(func() { outs = step.Graph.Run(anys(Inputs(step.Graph))...) }); err != nil {
			return r, err
		}
		for _, o := range outs {
			if err := o.ConstBytes(func(b []byte) { r.outputs = append(r.outputs, append([]byte(nil), b...)) }); err != nil {
				return r, err
			}
		}
		return r, nil
	}
	for _, mode := range Modes() {
		cfg := mode.Apply(base)
		off, err := build(cfg, "0")
		if err != nil {
			t.Errorf("%s ties off: %v", mode.Name, err)
			continue
		}
		on, err := build(cfg, "1")
		if err != nil {
			t.Errorf("%s ties on: %v", mode.Name, err)
			continue
		}
		if on.saved.Total != off.saved.Total || fmt.Sprint(on.saved.ByKind) != fmt.Sprint(off.saved.ByKind) {
			t.Errorf("%s %s: saved activations %d %v with ties, %d %v without", model, mode.Name, on.saved.Total, on.saved.ByKind,
				off.saved.Total, off.saved.ByKind)
		}
		if on.peak.Transient() != off.peak.Transient() || on.peak.Bytes > off.peak.Bytes {
			t.Errorf("%s %s: simulated peak %d (%d above the resident) with ties, %d (%d) without", model, mode.Name,
				on.peak.Bytes, on.peak.Transient(), off.peak.Bytes, off.peak.Transient())
		}
		if len(on.outputs) != len(off.outputs) {
			t.Errorf("%s %s: %d outputs with ties, %d without", model, mode.Name, len(on.outputs), len(off.outputs))
			continue
		}
		for i := range on.outputs {
			if string(on.outputs[i]) != string(off.outputs[i]) {
				t.Errorf("%s %s: output %d (0: the loss) differs with ties", model, mode.Name, i)
			}
		}
	}
}

func anys(ts []*tensors.Tensor) []any {
	out := make([]any, len(ts))
	for i, x := range ts {
		out[i] = x
	}
	return out
}
