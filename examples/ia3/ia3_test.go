package ia3_test

import (
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/examples/ia3"
	"github.com/memfit/memfit/examples/internal/extest"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/msnorm"
)

func TestMain(m *testing.M) { gtest.Main(m) }

func maxRel(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range want {
		d = max(d, math.Abs(float64(got[i])-want[i])/(math.Abs(want[i])+1e-3))
	}
	return d
}

// TestIA3MatchesPEFT: for output scaling (y = (W x + b) ∘ l) and input scaling (y = W (x ∘ l) + b), the forward
// through a GoMLX graph, l's gradient and the merged layer equal PEFT's formulas computed in float64; unmerging
// the merge gives the base layer back, and a zero l is refused.
func TestIA3MatchesPEFT(t *testing.T) {
	const tokens, in, out = 3, 5, 4
	w, b, x, rr := gtest.Rand(1, out*in, 1), gtest.Rand(2, out, 1), gtest.Rand(3, tokens*in, 1), gtest.Rand(4, tokens*out, 1)
	for _, feedforward := range []bool{false, true} {
		name := map[bool]string{false: "output", true: "input"}[feedforward]
		layer := models.LinearLayer{Path: "mlp.down_proj", In: in, Out: out, HasBias: true}
		if !feedforward {
			layer.Path = "self_attn.k_proj"
		}
		newAdapter, err := ia3.New(ia3.Config{FeedForward: []string{"down_proj"}})
		if err != nil {
			t.Fatal(err)
		}
		a := newAdapter(layer)
		init, err := a.Init(layer, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		n, dims := out, []int{out, 1}
		if feedforward {
			n, dims = in, []int{1, in}
		}
		if got := init[ia3.Suffix].Shape().Dimensions; len(got) != 2 || got[0] != dims[0] || got[1] != dims[1] {
			t.Errorf("%s: ia3_l has shape %v, want %v", name, got, dims)
		}
		for _, v := range gtest.Float32s(init[ia3.Suffix]) {
			if v != 1 {
				t.Fatalf("%s: ia3_l starts at %g, want 1", name, v)
			}
		}
		l := gtest.Rand(5, n, 1)
		for i := range l {
			l[i] += 1
		}

		// PEFT in float64: y, and dL/dl for L = Σ y ∘ R.
		wantY := make([]float64, tokens*out)
		wantDL := make([]float64, n)
		for tk := 0; tk < tokens; tk++ {
			for o := 0; o < out; o++ {
				base := float64(b[o])
				for i := 0; i < in; i++ {
					xi := float64(x[tk*in+i])
					if feedforward {
						xi *= float64(l[i])
						wantDL[i] += float64(rr[tk*out+o]) * float64(w[o*in+i]) * float64(x[tk*in+i])
					}
					base += float64(w[o*in+i]) * xi
				}
				if feedforward {
					wantY[tk*out+o] = base
				} else {
					wantY[tk*out+o] = base * float64(l[o])
					wantDL[o] += float64(rr[tk*out+o]) * base
				}
			}
		}
		got := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := a.Forward(adapter.Context{}, layer, p[0], p[1], p[2], map[string]*graph.Node{ia3.Suffix: p[3]})
			return append([]*graph.Node{y}, engine.Gradient(graph.ReduceAllSum(graph.Mul(y, p[4])), p[3])...)
		}, gtest.Tensor(x, tokens, in), gtest.Tensor(w, out, in), gtest.Tensor(b, out), gtest.Tensor(l, dims...), gtest.Tensor(rr, tokens, out))
		if e := maxRel(got[0], wantY); e > 1e-5 {
			t.Errorf("%s: forward differs from PEFT's by %g", name, e)
		}
		if e := maxRel(got[1], wantDL); e > 1e-5 {
			t.Errorf("%s: dL/dl differs from the reference by %g", name, e)
		}

		// Merge: W' = diag(l) W, b' = l ∘ b (output) or W' = W diag(l), b unchanged (input).
		params := models.Params{ia3.Suffix: gtest.Tensor(l, dims...)}
		base := msnorm.Dense{Out: out, In: in, W: w, B: b}
		merged, err := a.Merge(layer, base, params)
		if err != nil {
			t.Fatal(err)
		}
		wantW, wantB := make([]float64, out*in), make([]float64, out)
		for o := 0; o < out; o++ {
			wantB[o] = float64(b[o])
			if !feedforward {
				wantB[o] *= float64(l[o])
			}
			for i := 0; i < in; i++ {
				var s float64
				if feedforward {
					s = float64(l[i])
				} else {
					s = float64(l[o])
				}
				wantW[o*in+i] = float64(w[o*in+i]) * s
			}
		}
		if e := max(maxRel(merged.W, wantW), maxRel(merged.B, wantB)); e > 1e-6 {
			t.Errorf("%s: merged layer differs from PEFT's merge by %g", name, e)
		}
		back, err := a.Unmerge(layer, merged, params)
		if err != nil {
			t.Fatal(err)
		}
		if e := max(gtest.MaxRelDiff(back.W, w, 1e-3), gtest.MaxRelDiff(back.B, b, 1e-3)); e > 1e-6 {
			t.Errorf("%s: Unmerge(Merge(W)) differs from W by %g", name, e)
		}
		zero := append([]float32(nil), l...)
		zero[1] = 0
		if _, err := a.Unmerge(layer, merged, models.Params{ia3.Suffix: gtest.Tensor(zero, dims...)}); err == nil || !strings.Contains(err.Error(), "ia3_l[1]") {
			t.Errorf("%s: unmerge with a zero l: %v", name, err)
		}
		if _, err := a.Merge(layer, base, models.Params{ia3.Suffix: gtest.Tensor(l[:n-1], n-1)}); err == nil {
			t.Errorf("%s: merge with a short l accepted", name)
		}
	}
}

// TestIA3ChangeOfBasis checks UnfoldInput's derivation on the host: merging l and folding the norm commute
// (Fold(Merge(W)) = Merge(Fold(W)) with the same l) for output scaling under any norm and for input scaling under
// a norm without shift, so l is unchanged; input scaling under a shift differs by a bias and is refused.
func TestIA3ChangeOfBasis(t *testing.T) {
	const in, out = 5, 3
	w, b := gtest.Rand(1, out*in, 1), gtest.Rand(2, out, 1)
	gamma := gtest.Rand(3, in, 0.3)
	for i := range gamma {
		gamma[i]++
	}
	rms := msnorm.NormAffine{Gamma: gamma}
	ln := msnorm.NormAffine{Gamma: gamma, Beta: gtest.Rand(4, in, 0.5)}
	newAdapter, _ := ia3.New(ia3.Config{Pattern: `.*\.down_proj`})
	for _, tc := range []struct {
		path      string
		norm      msnorm.NormAffine
		refused   bool
		n         int
		dims      []int
		normNamed string
	}{
		{"model.layers.0.self_attn.q_proj", ln, false, out, []int{out, 1}, "LayerNorm"},
		{"model.layers.0.mlp.down_proj", rms, false, in, []int{1, in}, "RMSNorm"},
		{"model.layers.0.mlp.down_proj", ln, true, in, []int{1, in}, "LayerNorm"},
	} {
		layer := models.LinearLayer{Path: tc.path, In: in, Out: out, HasBias: true}
		a := newAdapter(layer)
		l := gtest.Rand(5, tc.n, 0.5)
		params := models.Params{ia3.Suffix: gtest.Tensor(l, tc.dims...)}
		unfolded, err := a.UnfoldInput(layer, params, adapter.FoldedInput{Norm: tc.norm})
		_, ferr := a.FoldInput(layer, params, adapter.FoldedInput{Norm: tc.norm})
		if tc.refused {
			if err == nil || ferr == nil || !strings.Contains(err.Error(), "merged") {
				t.Errorf("%s under %s: %v / %v, want a refusal", tc.path, tc.normNamed, err, ferr)
			}
		} else if err != nil || ferr != nil || gtest.MaxAbsDiff(gtest.Float32s(unfolded[ia3.Suffix]), l) != 0 {
			t.Errorf("%s under %s: %v / %v, want l unchanged", tc.path, tc.normNamed, err, ferr)
		}
		// Merge on the original layer then fold, versus fold then merge: equal exactly when l may stay as it is.
		orig := msnorm.Dense{Out: out, In: in, W: w, B: b}
		m1, _ := a.Merge(layer, orig, params)
		f1, err := msnorm.Fold(tc.norm, m1)
		if err != nil {
			t.Fatal(err)
		}
		f2, err := msnorm.Fold(tc.norm, orig)
		if err != nil {
			t.Fatal(err)
		}
		m2, _ := a.Merge(layer, f2, params)
		d := max(gtest.MaxRelDiff(f1.W, m2.W, 1), gtest.MaxRelDiff(f1.B, m2.B, 1))
		if commute := d < 1e-6; commute == tc.refused {
			t.Errorf("%s under %s: merge and fold differ by %g, but refused = %v", tc.path, tc.normNamed, d, tc.refused)
		}
	}
}

// feedforward names ViT's MLP output layers (not attention.output.dense, which "output.dense" would also end).
var feedforward = ia3.Config{FeedForward: []string{"layer.0.output.dense", "layer.1.output.dense"}}

// targets adapt the keys, values, both MLP layers and the attention output ("down" is every *.output.dense).
var targets = []string{"k", "v", "up", "down"}

// TestIA3TrainsAndExports trains IA3 on an MS-norm ViT with non-trivial LayerNorms (it starts as the base model
// and its loss falls), exports it as PEFT does (config, keys and shapes: [out, 1] scaling outputs, [1, in]
// scaling inputs), reads it into a fresh plain model, and merges it into a checkpoint the stock ViT code loads:
// both give the trained model's logits.
func TestIA3TrainsAndExports(t *testing.T) {
	model := extest.ViT(t, vit.Options{MSNorm: true}, true)
	newAdapter, err := ia3.New(feedforward)
	if err != nil {
		t.Fatal(err)
	}
	set := extest.NewSet(t, model, targets, newAdapter)
	data := extest.Images()
	batch := extest.Batch(t, data, 6)
	plain, err := finetune.Logits(gtest.Backend(t), model, nil, nil, batch)
	if err != nil {
		t.Fatal(err)
	}
	adapted, err := finetune.Logits(gtest.Backend(t), model, nil, set, batch)
	if err != nil {
		t.Fatal(err)
	}
	if d := gtest.MaxAbsDiff(gtest.Float32s(adapted), gtest.Float32s(plain)); d != 0 {
		t.Errorf("IA3 with l = 1 changes the logits by %g", d)
	}
	losses, tr := extest.Fit(t, model, extest.Config(20, 2e-2), set, data, "")
	t.Logf("losses %.4f", losses)
	if first, last := losses[0], losses[len(losses)-1]; !(last < 0.7*first) {
		t.Errorf("loss %.4f -> %.4f, want a fall of 30%%", first, last)
	}

	for _, path := range set.Paths() {
		l := gtest.Float32s(tr.Train[path+"."+ia3.Suffix])
		moved := 0.0
		for _, v := range l {
			moved = max(moved, math.Abs(float64(v)-1))
		}
		if moved < 1e-3 {
			t.Errorf("%s: ia3_l stayed at ones (max change %g)", path, moved)
		}
	}
	dir := filepath.Join(t.TempDir(), "adapter")
	extest.CheckImport(t, tr, extest.ViT(t, vit.Options{}, true), dir, batch, 1e-5)
	pattern := `.*(?:layer\.0\.output\.dense|layer\.1\.output\.dense)`
	extest.CheckConfig(t, dir, map[string]any{"peft_type": "IA3", "feedforward_modules": pattern, "fan_in_fan_out": false,
		"init_ia3_weights": true, "target_modules": set.Paths(), "modules_to_save": []string{"classifier"}})
	re := regexp.MustCompile("^(?:" + pattern + ")$") // as PEFT's re.fullmatch
	var ff []string
	shapes := extest.Shapes(t, filepath.Join(dir, finetune.AdapterWeights))
	want := map[string][]int{"base_model.model.classifier.weight": {3, 48}, "base_model.model.classifier.bias": {3}}
	for _, l := range set.Layers {
		if re.MatchString(l.Path) {
			ff = append(ff, l.Path)
			want["base_model.model."+l.Path+".ia3_l"] = []int{1, l.In}
		} else {
			want["base_model.model."+l.Path+".ia3_l"] = []int{l.Out, 1}
		}
	}
	if len(ff) != 2 || len(set.Layers) != 10 {
		t.Errorf("%d adapted layers, feedforward (PEFT's fullmatch): %v", len(set.Layers), ff)
	}
	if len(shapes) != len(want) {
		t.Errorf("adapter file has %d tensors, want %d", len(shapes), len(want))
	}
	for k, dims := range want {
		if got, ok := shapes[k]; !ok || len(got) != len(dims) || got[0] != dims[0] || (len(got) > 1 && got[1] != dims[1]) {
			t.Errorf("%s: shape %v (present %v), want %v", k, got, ok, dims)
		}
	}
	extest.CheckMerged(t, tr, extest.LoadViT, filepath.Join(t.TempDir(), "merged"), batch, 1e-5)
}

// TestIA3InputScalingUnderLayerNormShift: IA3 scaling the input of a layer folded from a LayerNorm with a bias
// (the MLP's first layer) has no PEFT form in the original basis: the PEFT export is refused and the merged
// export gives the trained model's logits.
func TestIA3InputScalingUnderLayerNormShift(t *testing.T) {
	model := extest.ViT(t, vit.Options{MSNorm: true}, true)
	newAdapter, _ := ia3.New(ia3.Config{FeedForward: []string{"intermediate.dense"}})
	data := extest.Images()
	_, tr := extest.Fit(t, model, extest.Config(3, 1e-2), extest.NewSet(t, model, []string{"up"}, newAdapter), data, "")
	if err := tr.ExportAdapter(filepath.Join(t.TempDir(), "adapter"), "x"); err == nil || !strings.Contains(err.Error(), "merged") {
		t.Errorf("PEFT export: %v, want a refusal naming the merged export", err)
	}
	extest.CheckMerged(t, tr, extest.LoadViT, filepath.Join(t.TempDir(), "merged"), extest.Batch(t, data, 6), 1e-5)
}

// TestIA3Resumes: an IA3 run interrupted at step 3 and resumed with a set built the same way ends bit-identical
// to the uninterrupted run; resuming it without its adapters is refused.
func TestIA3Resumes(t *testing.T) {
	model := extest.ViT(t, vit.Options{}, false)
	newAdapter, _ := ia3.New(feedforward)
	extest.CheckResume(t, model, extest.Config(6, 1e-2), func() *adapter.Set { return extest.NewSet(t, model, targets, newAdapter) }, extest.Images(), 3)
}

// TestIA3Format: the registered format reads PEFT's IA3 configs with feedforward_modules as a list (path
// endings) or a string (a regular expression matching the whole path), and refuses fan_in_fan_out.
func TestIA3Format(t *testing.T) {
	layer := models.LinearLayer{Path: "model.layers.0.mlp.down_proj", In: 4, Out: 2}
	other := models.LinearLayer{Path: "model.layers.0.self_attn.v_proj", In: 4, Out: 4}
	for _, ff := range []any{[]any{"down_proj"}, "model\\.layers\\.\\d+\\.mlp\\.down_proj"} {
		f, err := adapter.FormatOf(adapter.PEFTConfig{"peft_type": "IA3", "feedforward_modules": ff})
		if err != nil || f.Name != "IA3" {
			t.Fatalf("format %q, %v", f.Name, err)
		}
		newAdapter, err := f.New(adapter.PEFTConfig{"peft_type": "IA3", "feedforward_modules": ff})
		if err != nil {
			t.Fatal(err)
		}
		if !newAdapter(layer).(*ia3.IA3).FeedForward || newAdapter(other).(*ia3.IA3).FeedForward {
			t.Errorf("feedforward_modules %v: wrong layers scaled on the input", ff)
		}
	}
	if _, err := ia3.FromPEFT(adapter.PEFTConfig{"peft_type": "IA3", "fan_in_fan_out": true}); err == nil || !strings.Contains(err.Error(), "fan_in_fan_out") {
		t.Errorf("fan_in_fan_out: %v", err)
	}
	if _, err := ia3.New(ia3.Config{Pattern: "("}); err == nil {
		t.Error("a bad pattern accepted")
	}
	cfg := (&ia3.IA3{}).PEFTConfig(nil)
	if ff, ok := cfg["feedforward_modules"].([]string); !ok || len(ff) != 0 {
		t.Errorf("no feedforward layers: feedforward_modules %v, want []", cfg["feedforward_modules"])
	}
}

// TestIA3LlamaRMSNorm: on a LLaMA with MS-norm and non-trivial RMSNorm weights, IA3 scaling the input of a
// folded layer (up_proj, after the post-attention norm) keeps l unchanged under the change of basis (RMSNorm
// has no shift): the PEFT export read into the plain model and the merged checkpoint give the trained logits.
func TestIA3LlamaRMSNorm(t *testing.T) {
	model := extest.Llama(t, decoder.Options{MSNorm: true}, true)
	newAdapter, err := ia3.New(ia3.Config{FeedForward: []string{"mlp.up_proj", "mlp.down_proj"}})
	if err != nil {
		t.Fatal(err)
	}
	set := extest.NewSet(t, model, []string{"q", "v", "up", "down"}, newAdapter)
	cfg := extest.Config(15, 1e-1)
	cfg.TrainModules = nil
	data := extest.Text()
	losses, tr := extest.Fit(t, model, cfg, set, data, "")
	t.Logf("losses %.4f", losses)
	first := (losses[0] + losses[1] + losses[2]) / 3
	last := (losses[len(losses)-1] + losses[len(losses)-2] + losses[len(losses)-3]) / 3
	if !(last < first-0.05) {
		t.Errorf("loss (mean of 3 steps) %.4f -> %.4f, want a fall of 0.05", first, last)
	}
	// l must have moved for the check of the change of basis to mean something.
	moved := 0.0
	for _, v := range gtest.Float32s(tr.Train["model.layers.0.mlp.up_proj."+ia3.Suffix]) {
		moved = max(moved, math.Abs(float64(v)-1))
	}
	if moved < 0.1 {
		t.Errorf("up_proj's ia3_l moved by at most %g", moved)
	}
	batch := extest.Batch(t, data, 4)
	dir := filepath.Join(t.TempDir(), "adapter")
	extest.CheckImport(t, tr, extest.Llama(t, decoder.Options{}, true), dir, batch, 1e-5)
	shapes := extest.Shapes(t, filepath.Join(dir, finetune.AdapterWeights))
	up := "base_model.model.model.layers.0.mlp.up_proj.ia3_l"
	if got := shapes[up]; len(got) != 2 || got[0] != 1 || got[1] != 64 {
		t.Errorf("%s has shape %v, want [1 64]", up, got)
	}
	extest.CheckMerged(t, tr, extest.LoadLlama, filepath.Join(t.TempDir(), "merged"), batch, 1e-5)
}
