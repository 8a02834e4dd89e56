package dora_test

import (
	"errors"
	_ "github.com/memfit/memfit/family/all" // the decoder families the goldens load as
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/examples/dora"
	"github.com/memfit/memfit/examples/internal/extest"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/msnorm"
)

func TestMain(m *testing.M) { gtest.Main(m) }

// reference is PEFT's DoRA on one layer in float64 with plain loops: V = W + s B A, n = ||V||_row, f = m / n,
// y = f ∘ (V x) + b, and the gradients of loss = Σ y ∘ R with n held constant (PEFT's weight_norm.detach()).
type reference struct {
	v, n, y, dm, da, db []float64
}

func peftDoRA(w, b, a, bm, m, x, rr []float32, tokens, in, out, r int, s float64) reference {
	var ref reference
	ref.v = make([]float64, out*in)
	ref.n = make([]float64, out)
	for o := 0; o < out; o++ {
		for i := 0; i < in; i++ {
			v := float64(w[o*in+i])
			for k := 0; k < r; k++ {
				v += s * float64(bm[o*r+k]) * float64(a[k*in+i])
			}
			ref.v[o*in+i] = v
			ref.n[o] += v * v
		}
		ref.n[o] = math.Sqrt(ref.n[o])
	}
	ref.y = make([]float64, tokens*out)
	ref.dm = make([]float64, out)
	ref.da = make([]float64, r*in)
	ref.db = make([]float64, out*r)
	for t := 0; t < tokens; t++ {
		xt := x[t*in : (t+1)*in]
		ax := make([]float64, r) // A x
		for k := 0; k < r; k++ {
			for i := 0; i < in; i++ {
				ax[k] += float64(a[k*in+i]) * float64(xt[i])
			}
		}
		for o := 0; o < out; o++ {
			vx := 0.0
			for i := 0; i < in; i++ {
				vx += ref.v[o*in+i] * float64(xt[i])
			}
			f := float64(m[o]) / ref.n[o]
			ref.y[t*out+o] = f*vx + float64(b[o])
			g := float64(rr[t*out+o])
			ref.dm[o] += g * vx / ref.n[o]
			for k := 0; k < r; k++ {
				ref.db[o*r+k] += s * f * g * ax[k]
				for i := 0; i < in; i++ {
					ref.da[k*in+i] += s * f * g * float64(bm[o*r+k]) * float64(xt[i])
				}
			}
		}
	}
	return ref
}

func maxRel(got []float32, want []float64) float64 {
	d := 0.0
	for i := range want {
		d = max(d, math.Abs(float64(got[i])-want[i])/(math.Abs(want[i])+1e-3))
	}
	if len(got) != len(want) {
		return math.Inf(1)
	}
	return d
}

// TestDoRAMatchesPEFT: on a tiny layer with random W, b, A, B, m and x, the adapter's initial magnitude, its
// forward (through a GoMLX graph), its gradients and its merged weight equal PEFT's formulas computed in float64.
func TestDoRAMatchesPEFT(t *testing.T) {
	const tokens, in, out, r = 3, 5, 4, 2
	cfg := lora.Config{Rank: r, Alpha: 3}
	s := cfg.Scale()
	layer := models.LinearLayer{Path: "l", In: in, Out: out, HasBias: true}
	w, b := gtest.Rand(1, out*in, 1), gtest.Rand(2, out, 1)
	a, bm, m := gtest.Rand(3, r*in, 1), gtest.Rand(4, out*r, 1), gtest.Rand(5, out, 1)
	x, rr := gtest.Rand(6, tokens*in, 1), gtest.Rand(7, tokens*out, 1)
	newAdapter, err := dora.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := newAdapter(layer)

	// Init: m = ||W||_row (B = 0), A within ±1/sqrt(in).
	init, err := d.Init(layer, func() (msnorm.Dense, error) { return msnorm.Dense{Out: out, In: in, W: w, B: b}, nil }, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	zero := peftDoRA(w, b, a, make([]float32, out*r), m, x, rr, tokens, in, out, r, s)
	if e := maxRel(gtest.Float32s(init[dora.SuffixMagnitude]), zero.n); e > 1e-6 {
		t.Errorf("initial magnitude differs from ||W||_row by %g", e)
	}
	for _, v := range gtest.Float32s(init[lora.SuffixB]) {
		if v != 0 {
			t.Fatalf("B starts at %g, want 0", v)
		}
	}
	for _, v := range gtest.Float32s(init[lora.SuffixA]) {
		if math.Abs(float64(v)) > 1/math.Sqrt(in) {
			t.Fatalf("A has %g, outside ±1/sqrt(%d)", v, in)
		}
	}
	if _, err := d.Init(layer, adapter.WeightsOf(nil)(layer), rand.New(rand.NewPCG(1, 2))); err == nil {
		t.Error("Init without base weights succeeded")
	}

	// Forward and gradients.
	ref := peftDoRA(w, b, a, bm, m, x, rr, tokens, in, out, r, s)
	got := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		params := map[string]*graph.Node{lora.SuffixA: p[3], lora.SuffixB: p[4], dora.SuffixMagnitude: p[5]}
		y := d.Forward(adapter.Context{}, layer, p[0], p[1], p[2], params)
		grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(y, p[6])), p[5], p[3], p[4])
		return append([]*graph.Node{y}, grads...)
	}, gtest.Tensor(x, tokens, in), gtest.Tensor(w, out, in), gtest.Tensor(b, out), gtest.Tensor(a, r, in),
		gtest.Tensor(bm, out, r), gtest.Tensor(m, out), gtest.Tensor(rr, tokens, out))
	for i, c := range []struct {
		name string
		want []float64
	}{{"y", ref.y}, {"dL/dm", ref.dm}, {"dL/dA", ref.da}, {"dL/dB", ref.db}} {
		if e := maxRel(got[i], c.want); e > 1e-5 {
			t.Errorf("%s differs from PEFT's formula by %g (relative)", c.name, e)
		}
	}

	// Merge: W' = (m / n) ∘ (W + s B A), bias unchanged.
	params := models.Params{lora.SuffixA: gtest.Tensor(a, r, in), lora.SuffixB: gtest.Tensor(bm, out, r), dora.SuffixMagnitude: gtest.Tensor(m, out)}
	merged, err := d.Merge(layer, msnorm.Dense{Out: out, In: in, W: w, B: b}, params)
	if err != nil {
		t.Fatal(err)
	}
	wantW := make([]float64, out*in)
	for o := 0; o < out; o++ {
		for i := 0; i < in; i++ {
			wantW[o*in+i] = float64(m[o]) / ref.n[o] * ref.v[o*in+i]
		}
	}
	if e := maxRel(merged.W, wantW); e > 1e-6 {
		t.Errorf("merged weight differs from (m/n)(W + sBA) by %g", e)
	}
	if gtest.MaxAbsDiff(merged.B, b) != 0 {
		t.Error("merge changed the bias")
	}
	if _, err := d.Unmerge(layer, merged, params); !errors.Is(err, dora.ErrNoUnmerge) {
		t.Errorf("Unmerge: %v, want ErrNoUnmerge", err)
	}

	// Change of basis under a norm without shift (RMSNorm): the moved adapter on u = g ∘ z over W_u = W diag(1/g)
	// computes PEFT's DoRA output of the folded adapter on z over W; FoldInput moves it back.
	g := gtest.Rand(8, in, 0.5)
	for k := range g {
		g[k] += 1.2
	}
	rms := msnorm.NormAffine{Gamma: g}
	fold := adapter.FoldedInput{Norm: rms, Base: msnorm.Dense{Out: out, In: in, W: w, B: b}}
	moved, err := d.UnfoldInput(layer, params, fold)
	if err != nil {
		t.Fatal(err)
	}
	wu, _, _ := rms.InputToOriginal(w, out)
	u := make([]float32, len(x))
	for k := range x {
		u[k] = x[k] * g[k%in]
	}
	onU := peftDoRA(wu, b, gtest.Float32s(moved[lora.SuffixA]), bm, gtest.Float32s(moved[dora.SuffixMagnitude]), u, rr, tokens, in, out, r, s)
	if e := maxRel(toF32(ref.y), onU.y); e > 1e-5 {
		t.Errorf("DoRA moved to the original basis computes another function: %g (relative)", e)
	}
	back, err := d.FoldInput(layer, moved, fold)
	if err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{lora.SuffixA, dora.SuffixMagnitude} {
		if dd := gtest.MaxAbsDiff(gtest.Float32s(back[suffix]), gtest.Float32s(params[suffix])); dd > 1e-5 {
			t.Errorf("FoldInput(UnfoldInput(%s)) is %g off", suffix, dd)
		}
	}
	shifted := adapter.FoldedInput{Norm: msnorm.NormAffine{Gamma: g, Beta: []float32{0, 0, 0.1, 0, 0}}, Base: fold.Base}
	if _, err := d.UnfoldInput(layer, params, shifted); err == nil || !strings.Contains(err.Error(), "merged") {
		t.Errorf("UnfoldInput under a shift: %v, want a refusal pointing to the merged export", err)
	}
	if _, err := d.FoldInput(layer, params, shifted); err == nil {
		t.Error("FoldInput under a shift accepted")
	}
}

func toF32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// TestDoRADropoutStartsAsBase: in a training step with dropout, a fresh DoRA layer (B = 0, m = ||W||) still
// computes the base layer exactly: PEFT's y = W x + b + (f - 1) W x' + f s B A x' with f = 1 and B = 0.
func TestDoRADropoutStartsAsBase(t *testing.T) {
	const tokens, in, out = 4, 6, 3
	cfg := lora.Config{Rank: 2, Alpha: 4, Dropout: 0.5}
	layer := models.LinearLayer{Path: "l", In: in, Out: out}
	w, b, x := gtest.Rand(1, out*in, 1), gtest.Rand(2, out, 1), gtest.Rand(3, tokens*in, 1)
	newAdapter, _ := dora.New(cfg)
	d := newAdapter(layer)
	init, err := d.Init(layer, func() (msnorm.Dense, error) { return msnorm.Dense{Out: out, In: in, W: w}, nil }, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	rng, err := graph.RNGStateFromSeed(9)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := gtest.RunBuilt(t, func(g *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
		inputs := []*tensors.Tensor{gtest.Tensor(x, tokens, in), gtest.Tensor(w, out, in), gtest.Tensor(b, out),
			init[lora.SuffixA], init[lora.SuffixB], init[dora.SuffixMagnitude], rng}
		p := make([]*graph.Node, len(inputs))
		for i, v := range inputs {
			p[i] = graph.Parameter(g, string(rune('a'+i)), v.Shape())
		}
		ctx := adapter.Context{Training: true, RNG: engine.NewRNG(p[6])}
		y := d.Forward(ctx, layer, p[0], p[1], p[2], map[string]*graph.Node{lora.SuffixA: p[3], lora.SuffixB: p[4], dora.SuffixMagnitude: p[5]})
		return []*graph.Node{y, engine.Linear(p[0], p[1], p[2])}, inputs
	})
	if e := gtest.MaxRelDiff(got[0], got[1], 1); e > 1e-6 {
		t.Errorf("fresh DoRA with dropout differs from the base layer by %g", e)
	}
}

// targets are the ViT layers the tests adapt: attention query and value, and both MLP layers.
var targets = []string{"q", "v", "up", "down"}

// TestDoRATrainsAndExports trains DoRA on a tiny ViT with the standard trainer (the loss falls and the magnitude
// moves), exports it as PEFT does (config fields, keys and shapes), reads it into a fresh model (same logits),
// merges it into a checkpoint the stock ViT code loads (same logits), and refuses to read it into an MS-norm
// model whose norms are not the identity.
func TestDoRATrainsAndExports(t *testing.T) {
	model := extest.ViT(t, vit.Options{}, false)
	newAdapter, err := dora.New(lora.Config{Rank: 4, Alpha: 8})
	if err != nil {
		t.Fatal(err)
	}
	set := extest.NewSet(t, model, targets, newAdapter)
	initial := models.Params{}
	for n, v := range set.Params {
		initial[n] = v
	}
	data := extest.Images()
	losses, tr := extest.Fit(t, model, extest.Config(12, 1e-2), set, data, "")
	t.Logf("losses %.4f", losses)
	if first, last := losses[0], losses[len(losses)-1]; !(last < 0.7*first) {
		t.Errorf("loss %.4f -> %.4f, want a fall of 30%%", first, last)
	}
	moved := 0
	for _, path := range set.Paths() {
		name := path + "." + dora.SuffixMagnitude
		if gtest.MaxAbsDiff(gtest.Float32s(tr.Train[name]), gtest.Float32s(initial[name])) > 1e-4 {
			moved++
		}
	}
	if moved != len(set.Paths()) {
		t.Errorf("the magnitude trained in %d of %d layers", moved, len(set.Paths()))
	}
	batch := extest.Batch(t, data, 6)
	dir := filepath.Join(t.TempDir(), "adapter")
	extest.CheckImport(t, tr, extest.ViT(t, vit.Options{}, false), dir, batch, 1e-6)

	extest.CheckConfig(t, dir, map[string]any{"peft_type": "LORA", "use_dora": true, "r": 4, "lora_alpha": 8,
		"use_rslora": false, "lora_dropout": 0, "fan_in_fan_out": false, "init_lora_weights": true, "bias": "none",
		"target_modules": set.Paths(), "modules_to_save": []string{"classifier"}, "base_model_name_or_path": "memfit/tiny"})
	shapes := extest.Shapes(t, filepath.Join(dir, finetune.AdapterWeights))
	want := map[string][]int{"base_model.model.classifier.weight": {3, 48}, "base_model.model.classifier.bias": {3}}
	for _, l := range set.Layers {
		p := "base_model.model." + l.Path + "."
		want[p+"lora_A.weight"] = []int{4, l.In}
		want[p+"lora_B.weight"] = []int{l.Out, 4}
		want[p+"lora_magnitude_vector"] = []int{l.Out}
	}
	if len(shapes) != len(want) {
		t.Errorf("adapter file has %d tensors, want %d", len(shapes), len(want))
	}
	for k, dims := range want {
		if got, ok := shapes[k]; !ok || !slices.Equal(got, dims) {
			t.Errorf("%s: shape %v (present %v), want %v", k, got, ok, dims)
		}
	}

	extest.CheckMerged(t, tr, extest.LoadViT, filepath.Join(t.TempDir(), "merged"), batch, 1e-5)

	folded := extest.ViT(t, vit.Options{MSNorm: true}, true)
	if _, err := finetune.ReadAdapter(dir, folded); err == nil || !strings.Contains(err.Error(), "merged") {
		t.Errorf("reading DoRA into an MS-norm model with non-trivial norms: %v, want a refusal", err)
	}
}

// TestDoRAWithMSNorm: trained on an MS-norm model, DoRA exports as PEFT when the folded norms have no shift:
// the identity (ViT with trivial LayerNorms) or RMSNorm (LLaMA with random norm weights, where the magnitude and
// A change basis); under a LayerNorm shift only the merged export is possible. The PEFT export read into the plain
// model and into another MS-norm model (FoldInput), and the merged checkpoint, give the trained logits.
func TestDoRAWithMSNorm(t *testing.T) {
	newAdapter, _ := dora.New(lora.Config{Rank: 2, Alpha: 4})
	data := extest.Images()
	batch := extest.Batch(t, data, 6)
	for _, randomNorms := range []bool{false, true} {
		model := extest.ViT(t, vit.Options{MSNorm: true}, randomNorms)
		_, tr := extest.Fit(t, model, extest.Config(3, 1e-2), extest.NewSet(t, model, targets, newAdapter), data, "")
		dir := filepath.Join(t.TempDir(), "adapter")
		if randomNorms {
			if err := tr.ExportAdapter(dir, "x"); err == nil || !strings.Contains(err.Error(), "merged") {
				t.Errorf("PEFT export of DoRA under non-trivial MS-norm: %v, want a refusal naming the merged export", err)
			}
		} else {
			extest.CheckImport(t, tr, extest.ViT(t, vit.Options{}, false), dir, batch, 1e-6)
		}
		extest.CheckMerged(t, tr, extest.LoadViT, filepath.Join(t.TempDir(), "merged"), batch, 1e-5)
	}

	model := extest.Llama(t, decoder.Options{MSNorm: true}, true)
	text := extest.Text()
	cfg := extest.Config(6, 3e-2)
	cfg.TrainModules = nil
	_, tr := extest.Fit(t, model, cfg, extest.NewSet(t, model, []string{"q", "v", "up"}, newAdapter), text, "")
	tb := extest.Batch(t, text, 4)
	dir := filepath.Join(t.TempDir(), "adapter")
	extest.CheckImport(t, tr, extest.Llama(t, decoder.Options{}, true), dir, tb, 1e-5)
	extest.CheckImport(t, tr, extest.Llama(t, decoder.Options{MSNorm: true}, true), filepath.Join(t.TempDir(), "again"), tb, 1e-5)
	extest.CheckMerged(t, tr, extest.LoadLlama, filepath.Join(t.TempDir(), "merged"), tb, 1e-5)
}

// TestDoRAResumes: a DoRA run with dropout, interrupted at step 3 and resumed with a set built the same way,
// ends bit-identical to the uninterrupted run; resuming it without its adapters is refused.
func TestDoRAResumes(t *testing.T) {
	model := extest.ViT(t, vit.Options{}, false)
	newAdapter, _ := dora.New(lora.Config{Rank: 2, Alpha: 4, Dropout: 0.1})
	extest.CheckResume(t, model, extest.Config(6, 1e-2), func() *adapter.Set { return extest.NewSet(t, model, targets, newAdapter) }, extest.Images(), 3)
}

// TestDoRAFormat: the registered format reads PEFT DoRA configs (and not plain LoRA ones), and refuses settings
// the example does not implement.
func TestDoRAFormat(t *testing.T) {
	f, err := adapter.FormatOf(adapter.PEFTConfig{"peft_type": "LORA", "use_dora": true, "r": 4.0, "lora_alpha": 8.0})
	if err != nil || f.Name != "DoRA" {
		t.Fatalf("format %q, %v", f.Name, err)
	}
	if f, err := adapter.FormatOf(adapter.PEFTConfig{"peft_type": "LORA", "r": 4.0}); err != nil || f.Name == "DoRA" {
		t.Errorf("plain LoRA read as %q (%v)", f.Name, err)
	}
	cfg, err := dora.FromPEFT(adapter.PEFTConfig{"peft_type": "LORA", "use_dora": true, "r": 4.0, "lora_alpha": 8.0, "use_rslora": true, "lora_dropout": 0.05})
	if err != nil || !reflect.DeepEqual(cfg, lora.Config{Rank: 4, Alpha: 8, RSLoRA: true, Dropout: 0.05}) {
		t.Errorf("config %+v, %v", cfg, err)
	}
	for key, v := range map[string]any{"fan_in_fan_out": true, "lora_bias": true, "bias": "all"} {
		c := adapter.PEFTConfig{"peft_type": "LORA", "use_dora": true, key: v}
		if _, err := f.New(c); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s=%v: %v, want a refusal naming it", key, v, err)
		}
	}
	if _, err := dora.New(lora.Config{Rank: 2, Alpha: 2, FrozenA: true}); err == nil {
		t.Error("DoRA with a frozen A accepted")
	}
}

// TestDoRAOnDecoderFamilies: DoRA trains on each decoder family's golden model under MS-norm (Gemma's (1 + w)
// norms folded, Phi-3's fused qkv_proj and gate_up_proj adapted as one layer each), exports as PEFT and reads back
// into the plain model with the same logits, and merges.
func TestDoRAOnDecoderFamilies(t *testing.T) {
	newAdapter, _ := dora.New(lora.Config{Rank: 2, Alpha: 4})
	text := extest.Text()
	for _, name := range []string{"qwen2_a", "qwen3_a", "mistral_a", "gemma2_a", "gemma3_a", "phi3_a"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(golden.SharedDir(t), "golden", name)
			load := func(msNorm bool) finetune.Model {
				cfg := finetune.Defaults()
				cfg.MSNorm = msNorm
				m, err := finetune.LoadModel(dir, cfg)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			model := load(true)
			cfg := extest.Config(3, 3e-2)
			cfg.TrainModules = nil
			losses, tr := extest.Fit(t, model, cfg, extest.NewSet(t, model, []string{"q", "v", "up"}, newAdapter), text, "")
			if !(losses[len(losses)-1] < losses[0]) {
				t.Errorf("%s: losses %v", name, losses)
			}
			tb := extest.Batch(t, text, 4)
			extest.CheckImport(t, tr, load(false), filepath.Join(t.TempDir(), "adapter"), tb, 1e-5)
			extest.CheckMerged(t, tr, func(d string) (finetune.Model, error) { return finetune.LoadModel(d, finetune.Defaults()) }, filepath.Join(t.TempDir(), "merged"), tb, 1e-5)
		})
	}
}
