package encoder_test

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/encoder"
)

// goldenRun is one forward (and, when grads, backward) pass of a golden model in some modes.
type goldenRun struct {
	logits, loss, last, pooled, positions []float32
	grads                                 map[string][]float32
}

func runGolden(t *testing.T, g *golden.File, opts encoder.Options, grads []string) goldenRun {
	t.Helper()
	m, err := encoder.Load(g.Dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	ids := g.Array(t, "inputs", "input_ids")
	mask := g.Array(t, "inputs", "attention_mask")
	inputs := []*tensors.Tensor{
		tensors.FromFlatDataAndDimensions(ids.Int32s(), ids.Dims...),
		tensors.FromFlatDataAndDimensions(mask.Int32s(), mask.Dims...),
	}
	hasTypes := slices.Contains(g.Keys(t, "inputs"), "token_type_ids")
	if hasTypes {
		tt := g.Array(t, "inputs", "token_type_ids")
		inputs = append(inputs, tensors.FromFlatDataAndDimensions(tt.Int32s(), tt.Dims...))
	}
	labels := g.Array(t, "labels")
	if m.Config.Regression() {
		inputs = append(inputs, tensors.FromFlatDataAndDimensions(labels.Float32s(), labels.Dims...))
	} else {
		inputs = append(inputs, tensors.FromFlatDataAndDimensions(labels.Int32s(), labels.Dims...))
	}
	var hasLast, hasPooled bool
	values, _ := gtest.RunBuilt(t, func(gr *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
		var nodes []*graph.Node
		for i, in := range inputs {
			nodes = append(nodes, graph.Parameter(gr, fmt.Sprint("in", i), in.Shape()))
		}
		var types *graph.Node
		if hasTypes {
			types = nodes[2]
		}
		b := models.Bind(gr, m.Params)
		out := m.Forward(b, nodes[0], nodes[1], types)
		l := m.Loss(out.Logits, nodes[len(nodes)-1])
		outputs := []*graph.Node{out.Logits, l, graph.ConvertDType(out.PositionIDs, out.Logits.DType())}
		if last := out.Hidden[len(out.Hidden)-1]; last != nil {
			outputs, hasLast = append(outputs, last), true
		}
		if out.Pooled != nil {
			outputs, hasPooled = append(outputs, out.Pooled), true
		}
		if len(grads) > 0 {
			wrt := make([]*graph.Node, len(grads))
			for i, n := range grads {
				wrt[i] = b.Node(n)
			}
			outputs = append(outputs, engine.Gradient(l, wrt...)...)
		}
		return outputs, append(inputs, b.Inputs(m.Params)...)
	})
	r := goldenRun{logits: values[0], loss: values[1], positions: values[2], grads: map[string][]float32{}}
	next := 3
	if hasLast {
		r.last, next = values[next], next+1
	}
	if hasPooled {
		r.pooled, next = values[next], next+1
	}
	for i, n := range grads {
		r.grads[n] = values[next+i]
	}
	return r
}

// TestGolden: roberta_a (3 classes, positions from the input ids), roberta_reg_a (regression, MSE) and bert_a
// (token types, pooler) against the reference: logits, loss, positions, last hidden state, pooler output and the
// listed gradients within 1e-4 relative, in the plain model; every mode (ReGELU2, MS-LN, memory-efficient
// attention, per-layer checkpointing) gives the same logits (the forward is exact in all of them), and MS-LN's
// within 1e-5 of the plain model's.
func TestGolden(t *testing.T) {
	for _, name := range []string{"roberta_a", "roberta_reg_a", "bert_a"} {
		t.Run(name, func(t *testing.T) { checkGolden(t, golden.Load(t, name)) })
	}
}

// checkGolden runs g's model in the plain mode and checks its outputs and gradients against the reference (1e-4
// relative), then checks that every memory mode gives the plain model's logits within 1e-5.
func checkGolden(t *testing.T, g *golden.File) {
	gradNames := g.Keys(t, "grads")
	slices.Sort(gradNames)
	plain := runGolden(t, g, encoder.Options{}, gradNames)
	check := func(what string, got []float32, path ...string) {
		t.Helper()
		d := golden.RelMaxDiff(got, g.Array(t, path...).Float32s())
		t.Logf("%s rel diff %.2g", what, d)
		if d > 1e-4 {
			t.Errorf("%s differs by %g (relative)", what, d)
		}
	}
	check("logits", plain.logits, "outputs", "logits")
	check("last hidden state", plain.last, "outputs", "last_hidden_state")
	if lossDiff := math.Abs(float64(plain.loss[0]) - g.Array(t, "outputs", "loss").Values[0]); lossDiff > 1e-5 {
		t.Errorf("loss differs by %g", lossDiff)
	}
	if slices.Contains(g.Keys(t, "outputs"), "position_ids") {
		check("position ids", plain.positions, "outputs", "position_ids")
	}
	if plain.pooled != nil {
		check("pooler output", plain.pooled, "outputs", "pooler_output")
	}
	for _, n := range gradNames {
		check("gradient of "+n, plain.grads[n], "grads", n)
	}
	for _, opts := range []encoder.Options{
		{MSNorm: true},
		{ApproxActivation: true, MSNorm: true, Attention: attention.KindMemoryEfficient},
		{ApproxActivation: true, GradCheckpoint: true},
		{MSNorm: true, GradCheckpoint: true},
	} {
		r := runGolden(t, g, opts, nil)
		d := golden.RelMaxDiff(r.logits, plain.logits)
		t.Logf("%+v: logits %.2g from the plain model's", opts, d)
		if limit := 1e-5; d > limit {
			t.Errorf("%+v: logits differ from the plain model's by %g (relative), more than %g", opts, d, limit)
		}
	}
}

// TestGoldenVariants: encoder configurations beyond the shared goldens (testdata/variants.py: a deeper RoBERTa
// with 6 heads of 8, eps 1e-12 and 4 classes; a RoBERTa whose padding id is 0; a BERT regression head of three
// layers; a BERT with three token types), made by the same plain-PyTorch reference of transformers 4.55.4
// (families_reference.py in ../shared/data/golden) where Debian's python3-torch is installed, checked as TestGolden
// checks the shared ones.
func TestGoldenVariants(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch, numpy").Run(); err != nil {
		t.Skipf("no torch in %s (Debian's python3-torch): %v", py, err)
	}
	out := t.TempDir()
	cmd := exec.Command(py, filepath.Join("testdata", "variants.py"), filepath.Join(golden.SharedDir(t), "golden"), out)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("variants.py: %v\n%s", err, b)
	}
	entries, err := os.ReadDir(out)
	if err != nil || len(entries) != 4 {
		t.Fatalf("variants: %v, %d folders", err, len(entries))
	}
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) { checkGolden(t, golden.LoadDir(t, filepath.Join(out, e.Name()))) })
	}
}
