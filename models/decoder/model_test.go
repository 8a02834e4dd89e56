package decoder_test

import (
	"fmt"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
)

// randomish returns parameters with non-trivial norms (1 ± 0.1), so folding is really exercised.
func randomish(cfg decoder.Config, seed uint64) models.Params {
	p := decoder.RandomParams(cfg, seed)
	for name, t := range p {
		if t.Rank() == 1 {
			noise := gtest.Rand(seed+uint64(len(name)), t.Shape().Size(), 0.1)
			for i := range noise {
				noise[i]++
			}
			p[name] = tensors.FromFlatDataAndDimensions(noise, t.Shape().Dimensions...)
		}
	}
	return p
}

type stepResult struct {
	values  [][]float32
	g       *graph.Graph
	outputs []*graph.Node
}

// step runs logits, loss and the gradients of every parameter the model has in its original (unfolded) form.
func step(t *testing.T, cfg decoder.Config, params models.Params, opts decoder.Options, ids, mask, labels *tensors.Tensor) stepResult {
	t.Helper()
	m, err := decoder.New(cfg, params, opts)
	if err != nil {
		t.Fatal(err)
	}
	var res stepResult
	values, g := gtest.RunBuilt(t, func(g *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
		idsN := graph.Parameter(g, "input_ids", ids.Shape())
		maskN := graph.Parameter(g, "attention_mask", mask.Shape())
		labelsN := graph.Parameter(g, "labels", labels.Shape())
		bound := models.Bind(g, m.Params)
		out := m.Forward(bound, idsN, maskN)
		var l *graph.Node
		if cfg.Task == decoder.SequenceClassification {
			l = loss.CrossEntropy(out.Logits, labelsN, loss.IgnoreIndex)
		} else {
			// Next-token loss: logits[:, :-1] against labels[:, 1:].
			n := out.Logits.Shape().Dim(1)
			l = loss.CrossEntropy(engine.SliceAxis(out.Logits, 1, 0, n-1), engine.SliceAxis(labelsN, 1, 1, n), loss.IgnoreIndex)
		}
		grads := engine.Gradient(l, bound.List()...)
		res.outputs = append([]*graph.Node{out.Logits, l}, grads...)
		return res.outputs, append([]*tensors.Tensor{ids, mask, labels}, bound.Inputs(m.Params)...)
	})
	res.values, res.g = values, g
	return res
}

func tinyInputs() (ids, mask, labels *tensors.Tensor) {
	idData := []int32{5, 9, 17, 3, 200, 41, 7, 8, 99, 13, 2, 61, 1, 250, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0}
	maskData := make([]int32, len(idData))
	for i, v := range idData {
		if v != 0 {
			maskData[i] = 1
		}
	}
	return tensors.FromFlatDataAndDimensions(idData, 2, 12), tensors.FromFlatDataAndDimensions(maskData, 2, 12),
		tensors.FromFlatDataAndDimensions(idData, 2, 12)
}

// TestModesAgree: the same checkpoint gives the same logits and loss in every mode, both attention kinds; the
// input-side gradients agree exactly (MS-RMSNorm and memory-efficient attention are exact) except with ReSiLU2.
func TestModesAgree(t *testing.T) {
	cfg, err := llama.Preset("tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	params := randomish(cfg, 1)
	ids, mask, labels := tinyInputs()
	base := step(t, cfg, params, decoder.Options{}, ids, mask, labels)
	for _, approx := range []bool{false, true} {
		for _, ms := range []bool{false, true} {
			for _, kind := range []attention.Kind{attention.KindStandard, attention.KindMemoryEfficient} {
				name := fmt.Sprintf("approx=%v ms=%v %s", approx, ms, kind)
				r := step(t, cfg, params, decoder.Options{ApproxActivation: approx, MSNorm: ms, Attention: kind}, ids, mask, labels)
				if d := gtest.MaxRelDiff(r.values[0], base.values[0], 1); d > 1e-5 {
					t.Errorf("%s: logits differ by %g", name, d)
				}
				if d := gtest.MaxRelDiff(r.values[1], base.values[1], 1); d > 1e-6 {
					t.Errorf("%s: loss differs by %g", name, d)
				}
				if !approx && !ms {
					for i := 2; i < len(r.values); i++ {
						if d := gtest.MaxRelDiff(r.values[i], base.values[i], 1e-3); d > 1e-4 {
							t.Errorf("%s: gradient %d differs by %g", name, i-2, d)
						}
					}
				}
			}
		}
	}
}

// TestGradCheckpointExact: checkpointing every layer gives the same loss and gradients and keeps less.
func TestGradCheckpointExact(t *testing.T) {
	cfg, _ := llama.Preset("tiny", 0)
	params := randomish(cfg, 4)
	ids, mask, labels := tinyInputs()
	plain := step(t, cfg, params, decoder.Options{}, ids, mask, labels)
	ckpt := step(t, cfg, params, decoder.Options{GradCheckpoint: true}, ids, mask, labels)
	for i := range plain.values {
		if d := gtest.MaxRelDiff(ckpt.values[i], plain.values[i], 1e-3); d > 1e-4 {
			t.Errorf("output %d differs by %g with checkpointing", i, d)
		}
	}
	sp, _ := memory.Saved(plain.g, plain.outputs...)
	sc, _ := memory.Saved(ckpt.g, ckpt.outputs...)
	if sc.Total >= sp.Total/2 {
		t.Errorf("checkpointing keeps %d bytes, plain %d: want far less", sc.Total, sp.Total)
	}
}

// TestReSiLU2AndMSNormKeepLess: the saved-activation list of a causal-LM step loses the gate projection's output
// (the SiLU input) with ReSiLU2 and the norm affine outputs with MS-RMSNorm.
func TestReSiLU2AndMSNormKeepLess(t *testing.T) {
	cfg, _ := llama.Preset("tiny", 0)
	params := randomish(cfg, 2)
	ids, mask, labels := tinyInputs()
	byMode := map[string]*memory.SavedReport{}
	for _, mode := range []decoder.Options{{}, {ApproxActivation: true}, {MSNorm: true}, {ApproxActivation: true, MSNorm: true}} {
		r := step(t, cfg, params, mode, ids, mask, labels)
		saved, err := memory.Saved(r.g, r.outputs...)
		if err != nil {
			t.Fatal(err)
		}
		byMode[fmt.Sprintf("%v/%v", mode.ApproxActivation, mode.MSNorm)] = saved
	}
	hidden := func(s *memory.SavedReport) int { return len(s.Find(2, 12, cfg.IntermediateSize)) }
	// Plain keeps gate, SiLU(gate), up and their product per layer; approx-act keeps SiLU(gate) and up (ReSiLU2
	// drops the SiLU input for 2-bit codes, and the product is rebuilt from its two saved factors).
	if h0, h1 := hidden(byMode["false/false"]), hidden(byMode["true/false"]); h0 != 4*cfg.NumHiddenLayers || h1 != 2*cfg.NumHiddenLayers {
		t.Errorf("approx-act keeps %d [B, T, intermediate] tensors, plain %d: want 2 and 4 per layer", h1, h0)
	}
	plain, ms := byMode["false/false"], byMode["false/true"]
	d := int64(2 * 12 * cfg.HiddenSize * 4)
	// Per layer, MS-RMSNorm drops the two affine outputs; the final norm is folded into lm_head too.
	if want := int64(2*cfg.NumHiddenLayers+1) * d; plain.Total-ms.Total != want {
		t.Errorf("MS-RMSNorm saves %d bytes, want %d", plain.Total-ms.Total, want)
	}
	both := byMode["true/true"]
	// The graph shape XLA must keep (issue 10's buffer-assignment check relies on it): the activation's backward
	// reads only the packed uint8 codes, never a float tensor the codes could be recomputed from, and each
	// MS-RMSNorm output is one saved tensor read by both the norm's and the next linear layer's backward.
	shared := 0
	for _, st := range both.Tensors {
		if st.Kind == engine.KindActivation && st.Shape.DType != dtypes.Uint8 {
			t.Errorf("approx-act keeps a %s tensor for the activation's backward", st.Shape)
		}
		reads := map[engine.Kind]bool{}
		for _, k := range st.ReadBy {
			reads[k] = true
		}
		if reads[engine.KindLinear] && reads[engine.KindNorm] {
			shared++
		}
	}
	// Every weight is trainable here: two norms per layer, and the final norm shared with lm_head.
	if shared != 2*cfg.NumHiddenLayers+1 {
		t.Errorf("%d saved tensors shared by a norm and a linear layer, want %d", shared, 2*cfg.NumHiddenLayers+1)
	}
	if !(both.Total < ms.Total && both.Total < byMode["true/false"].Total) {
		t.Errorf("combined %d not below each alone (%d, %d)", both.Total, ms.Total, byMode["true/false"].Total)
	}
}

// TestTiedHead: with tie_word_embeddings the embedding table is the head (no lm_head parameter), MS-RMSNorm
// keeps the final norm plain (folding it would untie the head) and gives the same logits, and a checkpoint that
// also stores the tied lm_head loads.
func TestTiedHead(t *testing.T) {
	cfg, _ := llama.Preset("tiny", 0)
	cfg.TieWordEmbeddings = true
	params := randomish(cfg, 9)
	if _, ok := params[decoder.LMHead]; ok {
		t.Fatal("a tied model has an lm_head parameter")
	}
	ids, mask, labels := tinyInputs()
	plain := step(t, cfg, params, decoder.Options{}, ids, mask, labels)
	ms := step(t, cfg, params, decoder.Options{MSNorm: true, ApproxActivation: true}, ids, mask, labels)
	if d := gtest.MaxRelDiff(ms.values[0], plain.values[0], 1); d > 1e-5 {
		t.Errorf("tied head: MS-norm logits differ by %g", d)
	}
	m, err := decoder.New(cfg, params, decoder.Options{MSNorm: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Params[decoder.FinalNorm]; !ok {
		t.Error("the final norm was folded into a tied head")
	}
	dir := t.TempDir()
	config, _ := llama.JSON(cfg)
	withHead := models.Params{decoder.LMHead: params[decoder.EmbedTokens]}
	for n, v := range params {
		withHead[n] = v
	}
	if err := models.SaveCheckpoint(dir, config, withHead, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := llama.Load(dir, decoder.Options{}); err != nil {
		t.Errorf("checkpoint with a stored tied lm_head: %v", err)
	}
}

// TestBlockPlan: a per-block plan giving every layer the model-wide mode builds the same step (same saved
// bytes, same values), and a mixed plan keeps an amount strictly between the two uniform ones, equal to the sum
// of its blocks' shares, with the same loss.
func TestBlockPlan(t *testing.T) {
	cfg, _ := llama.Preset("tiny", 0)
	if cfg.NumHiddenLayers < 2 {
		t.Fatalf("the tiny preset has %d layers, the test needs 2", cfg.NumHiddenLayers)
	}
	params := randomish(cfg, 5)
	ids, mask, labels := tinyInputs()
	saved := func(opts decoder.Options) (int64, []float32) {
		r := step(t, cfg, params, opts, ids, mask, labels)
		s, err := memory.Saved(r.g, r.outputs...)
		if err != nil {
			t.Fatal(err)
		}
		return s.Total, r.values[1]
	}
	n := cfg.NumHiddenLayers
	plan := func(p string) []models.BlockMode {
		modes, err := models.ParseBlockPlan(p, n)
		if err != nil {
			t.Fatal(err)
		}
		return modes
	}
	plain, lossPlain := saved(decoder.Options{})
	for _, c := range []struct {
		mode   string
		global decoder.Options
	}{{"approx-act", decoder.Options{ApproxActivation: true}}, {"grad-ckpt", decoder.Options{GradCheckpoint: true}}} {
		uniform, _ := saved(c.global)
		perBlock, loss := saved(decoder.Options{Blocks: plan(fmt.Sprintf("%s*%d", c.mode, n))})
		if perBlock != uniform {
			t.Errorf("%s on every block keeps %d bytes, the model-wide option %d", c.mode, perBlock, uniform)
		}
		if d := gtest.MaxRelDiff(loss, lossPlain, 1); d > 1e-6 {
			t.Errorf("%s plan: loss differs by %g", c.mode, d)
		}
		// The first block in this mode, the others plain: one block's share of the saving.
		mixed, _ := saved(decoder.Options{Blocks: plan(fmt.Sprintf("%s,plain*%d", c.mode, n-1))})
		if !(uniform < mixed && mixed < plain) {
			t.Errorf("%s on one block keeps %d bytes, want between %d and %d", c.mode, mixed, uniform, plain)
		}
		if c.mode == "approx-act" && plain-mixed != (plain-uniform)/int64(n) {
			t.Errorf("approx-act on one block saves %d bytes, want 1/%d of %d", plain-mixed, n, plain-uniform)
		}
	}
	if _, err := decoder.New(cfg, params, decoder.Options{Blocks: plan(fmt.Sprintf("plain*%d", n))[:n-1]}); err == nil {
		t.Error("a plan shorter than the model must be refused")
	}
}
