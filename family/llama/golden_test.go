package llama_test

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
)

// goldenRun holds one forward/backward on the golden inputs.
type goldenRun struct {
	logits, loss []float32
	hidden       [][]float32
	pooled       []float32
	grads        map[string][]float32
}

// runGolden loads the model (weights from weightsFile inside the golden folder when not empty) in opts, runs
// the golden inputs with labels, and returns logits, loss, hidden states and the gradients of gradNames.
func runGolden(t *testing.T, g *golden.File, weightsFile string, opts decoder.Options, labels golden.Array, gradNames []string) goldenRun {
	t.Helper()
	m, err := llama.Load(g.Dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if weightsFile != "" {
		params, err := models.LoadParams(filepath.Join(g.Dir, weightsFile), decoder.Shapes(m.Config), models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if m, err = decoder.New(m.Config, params, opts); err != nil {
			t.Fatal(err)
		}
	}
	ids := g.Array(t, "inputs", "input_ids")
	mask := g.Array(t, "inputs", "attention_mask")
	idsT := tensors.FromFlatDataAndDimensions(ids.Int32s(), ids.Dims...)
	maskT := tensors.FromFlatDataAndDimensions(mask.Int32s(), mask.Dims...)
	labelsT := tensors.FromFlatDataAndDimensions(labels.Int32s(), labels.Dims...)
	nHidden := 0
	values, _ := gtest.RunBuilt(t, func(gr *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
		idsN := graph.Parameter(gr, "input_ids", idsT.Shape())
		maskN := graph.Parameter(gr, "attention_mask", maskT.Shape())
		labelsN := graph.Parameter(gr, "labels", labelsT.Shape())
		b := models.Bind(gr, m.Params)
		out := m.Forward(b, idsN, maskN)
		var l *graph.Node
		if m.Config.Task == decoder.SequenceClassification {
			l = loss.CrossEntropy(out.Logits, labelsN, loss.IgnoreIndex)
		} else {
			n := out.Logits.Shape().Dim(1)
			l = loss.CrossEntropy(engine.SliceAxis(out.Logits, 1, 0, n-1), engine.SliceAxis(labelsN, 1, 1, n), loss.IgnoreIndex)
		}
		wrt := make([]*graph.Node, len(gradNames))
		for i, n := range gradNames {
			wrt[i] = b.Node(n)
		}
		outputs := []*graph.Node{out.Logits, l}
		if len(wrt) > 0 {
			outputs = append(outputs, engine.Gradient(l, wrt...)...)
		}
		for _, h := range out.Hidden {
			if h != nil {
				outputs = append(outputs, h)
				nHidden++
			}
		}
		if out.PooledPositions != nil {
			outputs = append(outputs, out.PooledPositions)
		}
		return outputs, append([]*tensors.Tensor{idsT, maskT, labelsT}, b.Inputs(m.Params)...)
	})
	r := goldenRun{logits: values[0], loss: values[1], grads: map[string][]float32{}}
	for i, n := range gradNames {
		r.grads[n] = values[2+i]
	}
	r.hidden = values[2+len(gradNames) : 2+len(gradNames)+nHidden]
	if m.Config.Task == decoder.SequenceClassification {
		r.pooled = values[len(values)-1]
	}
	return r
}

func TestGoldenCausalLM(t *testing.T) {
	g := golden.Load(t, "llama_a")
	labels := g.Array(t, "labels")
	wantLogits := g.Array(t, "outputs", "logits").Float32s()
	wantLoss := g.Array(t, "outputs", "loss").Values[0]
	gradNames := g.Keys(t, "grads")
	for _, approx := range []bool{false, true} {
		for _, ms := range []bool{false, true} {
			for _, kind := range []attention.Kind{attention.KindStandard, attention.KindMemoryEfficient} {
				name := fmt.Sprintf("approx=%v,ms=%v,%s", approx, ms, kind)
				t.Run(name, func(t *testing.T) {
					exactGrads := !approx && !ms
					var names []string
					if exactGrads {
						names = gradNames
					}
					r := runGolden(t, g, "", decoder.Options{ApproxActivation: approx, MSNorm: ms, Attention: kind}, labels, names)
					d := golden.RelMaxDiff(r.logits, wantLogits)
					t.Logf("logits rel diff %.2g, loss diff %.2g", d, math.Abs(float64(r.loss[0])-wantLoss))
					if d > 1e-4 {
						t.Errorf("logits differ from transformers by %g (relative)", d)
					}
					if d := math.Abs(float64(r.loss[0]) - wantLoss); d > 1e-5 {
						t.Errorf("loss %g, transformers %g", r.loss[0], wantLoss)
					}
					for _, n := range names {
						d := golden.RelMaxDiff(r.grads[n], g.Array(t, "grads", n).Float32s())
						t.Logf("grad %s rel diff %.2g", n, d)
						if d > 1e-4 {
							t.Errorf("gradient of %s differs by %g (relative)", n, d)
						}
					}
				})
			}
		}
	}
	// Padded positions ignored: the masked labels' loss.
	r := runGolden(t, g, "", decoder.Options{}, g.Array(t, "masked_labels", "labels"), nil)
	if want := g.Array(t, "masked_labels", "loss").Values[0]; math.Abs(float64(r.loss[0])-want) > 1e-5 {
		t.Errorf("masked loss %g, transformers %g", r.loss[0], want)
	}
}

// TestGoldenBF16Weights: the bfloat16 checkpoint, upcast exactly to float32, reproduces transformers' bf16
// goldens.
func TestGoldenBF16Weights(t *testing.T) {
	g := golden.Load(t, "llama_a")
	r := runGolden(t, g, "model-bf16.safetensors", decoder.Options{}, g.Array(t, "labels"), nil)
	t.Logf("bf16 weights: logits rel diff %.2g, loss diff %.2g", golden.RelMaxDiff(r.logits, g.Array(t, "bf16", "outputs", "logits").Float32s()),
		math.Abs(float64(r.loss[0])-g.Array(t, "bf16", "outputs", "loss").Values[0]))
	if d := golden.RelMaxDiff(r.logits, g.Array(t, "bf16", "outputs", "logits").Float32s()); d > 1e-4 {
		t.Errorf("bf16-weight logits differ by %g (relative)", d)
	}
	if want := g.Array(t, "bf16", "outputs", "loss").Values[0]; math.Abs(float64(r.loss[0])-want) > 1e-5 {
		t.Errorf("bf16-weight loss %g, transformers %g", r.loss[0], want)
	}
	// And it is far from the float32 logits: the bf16 weights really were used.
	if d := golden.RelMaxDiff(r.logits, g.Array(t, "outputs", "logits").Float32s()); d < 1e-3 {
		t.Errorf("bf16-weight logits within %g of the float32 ones: were the bf16 weights loaded?", d)
	}
}

func TestGoldenSequenceClassification(t *testing.T) {
	g := golden.Load(t, "llama_c")
	gradNames := g.Keys(t, "grads")
	for _, ms := range []bool{false, true} {
		var names []string
		if !ms {
			names = gradNames
		}
		r := runGolden(t, g, "", decoder.Options{MSNorm: ms}, g.Array(t, "labels"), names)
		t.Logf("ms=%v: logits rel diff %.2g, loss diff %.2g", ms, golden.RelMaxDiff(r.logits, g.Array(t, "outputs", "logits").Float32s()),
			math.Abs(float64(r.loss[0])-g.Array(t, "outputs", "loss").Values[0]))
		if d := golden.RelMaxDiff(r.logits, g.Array(t, "outputs", "logits").Float32s()); d > 1e-4 {
			t.Errorf("ms=%v: logits differ by %g (relative)", ms, d)
		}
		if want := g.Array(t, "outputs", "loss").Values[0]; math.Abs(float64(r.loss[0])-want) > 1e-5 {
			t.Errorf("ms=%v: loss %g, transformers %g", ms, r.loss[0], want)
		}
		if gtest.MaxAbsDiff(r.pooled, g.Array(t, "outputs", "pooled_positions").Float32s()) != 0 {
			t.Errorf("pooled positions %v", r.pooled)
		}
		for _, n := range names {
			d := golden.RelMaxDiff(r.grads[n], g.Array(t, "grads", n).Float32s())
			t.Logf("grad %s rel diff %.2g", n, d)
			if d > 1e-4 {
				t.Errorf("gradient of %s differs by %g (relative)", n, d)
			}
		}
		if !ms {
			var hidden []golden.Array
			for i := 0; i < 3; i++ {
				hidden = append(hidden, g.Array(t, "outputs", "hidden_states", fmt.Sprint(i)))
			}
			if len(r.hidden) != len(hidden) {
				t.Fatalf("%d hidden states, want %d", len(r.hidden), len(hidden))
			}
			for i := range hidden {
				if d := golden.RelMaxDiff(r.hidden[i], hidden[i].Float32s()); d > 1e-4 {
					t.Errorf("hidden state %d differs by %g (relative)", i, d)
				}
			}
		}
	}
}
