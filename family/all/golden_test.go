package all_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	_ "github.com/memfit/memfit/family/all"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
)

// goldenFamilies are the decoder families' goldens (../shared/data/golden/README.md: plain-PyTorch
// re-implementations of transformers 4.55.4's modeling files), each with the family its folder must load as.
var goldenFamilies = []struct{ dir, family string }{
	{"qwen2_a", "qwen2"}, {"qwen3_a", "qwen3"}, {"mistral_a", "mistral"}, {"gemma2_a", "gemma2"}, {"gemma3_a", "gemma3_text"}, {"phi3_a", "phi3"},
}

// goldenRun runs model on a golden file's inputs: logits, the loss against its labels, the final-normed hidden
// state, the gradients of grads, and the last position's logits decoded through the key/value cache (Decode's
// prefill).
func goldenRun(t *testing.T, model finetune.Model, g *golden.File, grads []string) (logits, loss, hidden, decoded []float32, gradValues [][]float32) {
	t.Helper()
	ids, mask, labels := g.Array(t, "inputs", "input_ids"), g.Array(t, "inputs", "attention_mask"), g.Array(t, "labels")
	idsT := tensors.FromFlatDataAndDimensions(ids.Int32s(), ids.Dims...)
	maskT := tensors.FromFlatDataAndDimensions(mask.Int32s(), mask.Dims...)
	labelsT := tensors.FromFlatDataAndDimensions(labels.Int32s(), labels.Dims...)
	l := model.(lm.Model)
	values, _ := gtest.RunBuilt(t, func(gr *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
		batch := map[string]*graph.Node{"input_ids": graph.Parameter(gr, "input_ids", idsT.Shape()),
			"attention_mask": graph.Parameter(gr, "attention_mask", maskT.Shape()), "labels": graph.Parameter(gr, "labels", labelsT.Shape())}
		bound := models.Bind(gr, model.Params())
		out := l.Forward(bound, batch["input_ids"], batch["attention_mask"])
		lossN := model.Loss(bound, batch)
		hidden := out.Hidden[len(out.Hidden)-1]
		if hidden == nil { // the final norm folded into an untied head under MS-norm
			hidden = out.Logits
		}
		outputs := []*graph.Node{out.Logits, lossN, hidden}
		// Prefill of the whole batch through the cache: the last position's logits.
		pos := graph.Iota(gr, idsT.Shape(), 1)
		dec, _ := l.Decode(bound, batch["input_ids"], pos, graph.ScalarZero(gr, idsT.DType()), batch["attention_mask"], nil)
		outputs = append(outputs, dec)
		for _, n := range grads {
			outputs = append(outputs, engine.Gradient(lossN, bound.Node(n))...)
		}
		return outputs, append([]*tensors.Tensor{idsT, maskT, labelsT}, bound.Inputs(model.Params())...)
	})
	return values[0], values[1], values[2], values[3], values[4:]
}

// lastLogits returns the logits [B, T, vocab] of a golden's inputs at each row's last position.
func lastLogits(t *testing.T, g *golden.File, logits []float32) []float32 {
	ids := g.Array(t, "inputs", "input_ids")
	bsz, seq := ids.Dims[0], ids.Dims[1]
	vocab := len(logits) / (bsz * seq)
	var last []float32
	for r := 0; r < bsz; r++ {
		last = append(last, logits[(r*seq+seq-1)*vocab:(r*seq+seq)*vocab]...)
	}
	return last
}

// TestGoldenFamilies: each decoder family's golden folder loads through the family registry as its family and
// reproduces the reference within 1e-4 relative (logits, last hidden state, listed gradients; loss within 1e-5),
// its rotary frequencies too; decoding the batch through the key/value cache gives the last position's logits;
// every memory mode gives the same logits (approx-act and MS-norm change only what the backward keeps), with
// either attention kind.
func TestGoldenFamilies(t *testing.T) {
	for _, tc := range goldenFamilies {
		t.Run(tc.dir, func(t *testing.T) {
			g := golden.Load(t, tc.dir)
			fam, err := finetune.FamilyOfFolder(g.Dir)
			if err != nil || fam.Name != tc.family {
				t.Fatalf("family of %s: %q, %v", tc.dir, fam.Name, err)
			}
			wantLogits := g.Array(t, "outputs", "logits").Float32s()
			wantLoss := g.Array(t, "outputs", "loss").Values[0]
			wantHidden := g.Array(t, "outputs", "last_hidden_state").Float32s()
			gradNames := g.Keys(t, "grads")
			for _, mode := range []struct {
				approx, ms bool
				kind       attention.Kind
			}{{false, false, attention.KindStandard}, {true, true, attention.KindMemoryEfficient}} {
				name := fmt.Sprintf("approx=%v,ms=%v,%s", mode.approx, mode.ms, mode.kind)
				t.Run(name, func(t *testing.T) {
					cfg := finetune.Defaults()
					cfg.ApproxAct, cfg.MSNorm, cfg.Attention = mode.approx, mode.ms, mode.kind.String()
					model, err := finetune.LoadModel(g.Dir, cfg)
					if err != nil {
						t.Fatal(err)
					}
					var names []string
					if !mode.approx && !mode.ms {
						names = gradNames
					}
					logits, loss, hidden, decoded, grads := goldenRun(t, model, g, names)
					d := golden.RelMaxDiff(logits, wantLogits)
					t.Logf("logits rel diff %.2g, loss diff %.2g", d, math.Abs(float64(loss[0])-wantLoss))
					if d > 1e-4 {
						t.Errorf("logits differ from the reference by %g (relative)", d)
					}
					if d := math.Abs(float64(loss[0]) - wantLoss); d > 1e-5*math.Max(1, math.Abs(wantLoss)) {
						t.Errorf("loss %g, reference %g", loss[0], wantLoss)
					}
					if !mode.ms {
						if d := golden.RelMaxDiff(hidden, wantHidden); d > 1e-4 {
							t.Errorf("last hidden state differs by %g (relative)", d)
						}
					}
					if d := golden.RelMaxDiff(decoded, lastLogits(t, g, wantLogits)); d > 1e-4 {
						t.Errorf("decoding through the cache: last logits differ by %g (relative)", d)
					}
					for i, n := range names {
						d := golden.RelMaxDiff(grads[i], g.Array(t, "grads", n).Float32s())
						t.Logf("grad %s rel diff %.2g", n, d)
						if d > 1e-4 {
							t.Errorf("gradient of %s differs by %g (relative)", n, d)
						}
					}
				})
			}
			c, err := fam.Shaped(g.Dir, finetune.ModelOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cfg := c.(lm.Model).Config
			if d := golden.RelMaxDiff(cfg.InvFreq(), g.Array(t, "rope", "inv_freq").Float32s()); d > 1e-6 {
				t.Errorf("rope inv_freq differs by %g", d)
			}
			if tc.family == "gemma3_text" {
				if d := golden.RelMaxDiff(cfg.RopeFor(true, 0).InvFreq, g.Array(t, "rope", "local_inv_freq").Float32s()); d > 1e-6 {
					t.Errorf("local rope inv_freq differs by %g", d)
				}
			}
			if s := cfg.RopeFor(false, 0).Scale; float64(s) != g.Array(t, "rope", "attention_scaling").Values[0] {
				t.Errorf("rope attention scaling %g", s)
			}
		})
	}
}
