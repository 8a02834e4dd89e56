package lora_test

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
)

// loraLayer returns a [out, in] layer with a rank-r LoRA whose A, B and b_B are random.
func loraLayer(out, in, r int) (models.LinearLayer, *lora.LoRA, models.Params) {
	l := models.LinearLayer{Path: "layer", In: in, Out: out, HasBias: true}
	p := models.Params{
		lora.SuffixA:     gtest.Tensor(gtest.Rand(1, r*in, 0.5), r, in),
		lora.SuffixB:     gtest.Tensor(gtest.Rand(2, out*r, 0.5), out, r),
		lora.SuffixBBias: gtest.Tensor(gtest.Rand(3, out, 0.5), out),
	}
	return l, &lora.LoRA{Config: lora.Config{Rank: r, Alpha: 6}}, p
}

// TestMergeMatchesDeltaAndUnmerges: Merge adds s B A to W and s b_B to b (a float64 reference), and Unmerge
// takes them off again.
func TestMergeMatchesDeltaAndUnmerges(t *testing.T) {
	const out, in, r = 5, 7, 3
	l, a, p := loraLayer(out, in, r)
	base := msnorm.Dense{Out: out, In: in, W: gtest.Rand(4, out*in, 1), B: gtest.Rand(5, out, 1)}
	merged, err := a.Merge(l, base, p)
	if err != nil {
		t.Fatal(err)
	}
	A, B, bb := gtest.Float32s(p[lora.SuffixA]), gtest.Float32s(p[lora.SuffixB]), gtest.Float32s(p[lora.SuffixBBias])
	s := 6.0 / r
	for o := 0; o < out; o++ {
		for i := 0; i < in; i++ {
			want := float64(base.W[o*in+i])
			for k := 0; k < r; k++ {
				want += s * float64(B[o*r+k]) * float64(A[k*in+i])
			}
			if d := math.Abs(want - float64(merged.W[o*in+i])); d > 1e-6 {
				t.Fatalf("merged W[%d,%d] = %g, want %g", o, i, merged.W[o*in+i], want)
			}
		}
		if want := float64(base.B[o]) + s*float64(bb[o]); math.Abs(want-float64(merged.B[o])) > 1e-6 {
			t.Fatalf("merged b[%d] = %g, want %g", o, merged.B[o], want)
		}
	}
	back, err := a.Unmerge(l, merged, p)
	if err != nil {
		t.Fatal(err)
	}
	if d := gtest.MaxAbsDiff(back.W, base.W); d > 1e-6 {
		t.Errorf("Unmerge(Merge(W)) differs from W by %g", d)
	}
	if d := gtest.MaxAbsDiff(back.B, base.B); d > 1e-6 {
		t.Errorf("Unmerge(Merge(b)) differs from b by %g", d)
	}
}

// TestChangeOfBasis: the LoRA branch moved to the original input by UnfoldInput computes, on u = g ∘ z + beta,
// what the folded branch computes on z (a LayerNorm with a shift, float64), and FoldInput moves it back.
func TestChangeOfBasis(t *testing.T) {
	const out, in, r = 4, 6, 2
	l, a, p := loraLayer(out, in, r)
	delete(p, lora.SuffixBBias)
	gamma := gtest.Rand(6, in, 1)
	for i := range gamma {
		gamma[i] += 1.5 // away from zero
	}
	norm := msnorm.NormAffine{Gamma: gamma, Beta: gtest.Rand(7, in, 1)}
	branch := func(p models.Params, x []float64) []float64 {
		A, B := gtest.Float32s(p[lora.SuffixA]), gtest.Float32s(p[lora.SuffixB])
		ax := make([]float64, r)
		for k := range ax {
			for i, v := range x {
				ax[k] += float64(A[k*in+i]) * v
			}
		}
		y := make([]float64, out)
		for o := range y {
			for k := range ax {
				y[o] += float64(B[o*r+k]) * ax[k]
			}
			if bb, ok := p[lora.SuffixBBias]; ok {
				y[o] += float64(gtest.Float32s(bb)[o])
			}
		}
		return y
	}
	z := gtest.Rand(8, in, 1)
	zs, us := make([]float64, in), make([]float64, in)
	for i := range z {
		zs[i] = float64(z[i])
		us[i] = float64(gamma[i])*zs[i] + float64(norm.Beta[i])
	}
	orig, err := a.UnfoldInput(l, p, adapter.FoldedInput{Norm: norm})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := orig[lora.SuffixBBias]; !ok {
		t.Fatal("a LayerNorm shift must land in lora_B.bias")
	}
	want, got := branch(p, zs), branch(orig, us)
	for o := range want {
		if math.Abs(want[o]-got[o]) > 1e-5 {
			t.Fatalf("unfolded branch gives %g on u, the folded one %g on z", got[o], want[o])
		}
	}
	back, err := a.FoldInput(l, orig, adapter.FoldedInput{Norm: norm})
	if err != nil {
		t.Fatal(err)
	}
	if d := gtest.MaxAbsDiff(gtest.Float32s(back[lora.SuffixA]), gtest.Float32s(p[lora.SuffixA])); d > 1e-6 {
		t.Errorf("FoldInput(UnfoldInput(A)) differs from A by %g", d)
	}
	if d := gtest.MaxAbsDiff(gtest.Float32s(back[lora.SuffixBBias]), make([]float32, out)); d > 1e-6 {
		t.Errorf("FoldInput(UnfoldInput) leaves a bias of %g", d)
	}
	zero := msnorm.NormAffine{Gamma: make([]float32, in)}
	if _, err := a.UnfoldInput(l, p, adapter.FoldedInput{Norm: zero}); err == nil || !strings.Contains(err.Error(), "norm scale") {
		t.Errorf("a zero norm scale must be refused, got %v", err)
	}
}

// TestPEFTConfigRoundTrip: the adapter_config.json fields LoRA writes read back to the same settings, and the
// settings memfit does not implement are refused by name.
func TestPEFTConfigRoundTrip(t *testing.T) {
	want := lora.Config{Rank: 4, Alpha: 12, RSLoRA: true, Dropout: 0.1}
	written := (&lora.LoRA{Config: want}).PEFTConfig(nil)
	c := adapter.PEFTConfig{}
	for k, v := range written {
		switch x := v.(type) {
		case int:
			c[k] = float64(x) // as JSON reads it
		default:
			c[k] = v
		}
	}
	got, err := lora.FromPEFT(c)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("FromPEFT(PEFTConfig) = %+v, %v; want %+v", got, err, want)
	}
	f, err := adapter.FormatOf(c)
	if err != nil || f.Name != "LoRA" {
		t.Fatalf("FormatOf(LoRA config) = %q, %v", f.Name, err)
	}
	for key, msg := range map[string]string{"fan_in_fan_out": "fan_in_fan_out", "bias": "bias"} {
		bad := adapter.PEFTConfig{}
		for k, v := range c {
			bad[k] = v
		}
		if key == "bias" {
			bad[key] = "all"
		} else {
			bad[key] = true
		}
		if _, err := lora.FromPEFT(bad); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: got %v", key, err)
		}
	}
	if _, err := adapter.FormatOf(adapter.PEFTConfig{"peft_type": "PROMPT_TUNING"}); err == nil || !strings.Contains(err.Error(), "LoRA") {
		t.Errorf("an unknown peft_type must be refused naming the registered formats, got %v", err)
	}
}

// TestReadSettingsEveryPEFTField: every field of PEFT 0.20's LoraConfig is honoured (read, or inert for what an
// adapter file computes) or refused by name when set; a key PEFT does not define is refused when set.
func TestReadSettingsEveryPEFTField(t *testing.T) {
	base := func() adapter.PEFTConfig {
		return adapter.PEFTConfig{"peft_type": "LORA", "r": 8.0, "lora_alpha": 16.0}
	}
	accepted := map[string]any{
		"task_type": "CAUSAL_LM", "auto_mapping": nil, "peft_version": "0.20.0", "base_model_name_or_path": "x",
		"revision": nil, "inference_mode": true, "target_modules": []any{"q_proj"}, "exclude_modules": []any{"k_proj"},
		"lora_dropout": 0.1, "fan_in_fan_out": false, "bias": "none", "use_rslora": true, "modules_to_save": []any{"score"},
		"init_lora_weights": "gaussian", "layers_to_transform": []any{0.0}, "layers_pattern": "layers",
		"rank_pattern": map[string]any{"q_proj": 4.0}, "alpha_pattern": map[string]any{"q_proj": 8.0},
		"megatron_config": nil, "megatron_core": "megatron.core", "trainable_token_indices": nil, "loftq_config": map[string]any{},
		"eva_config": map[string]any{"rho": 2.0}, "corda_config": nil, "lora_ga_config": nil, "use_dora": false,
		"velora_config": nil, "alora_invocation_tokens": nil, "use_qalora": false, "qalora_group_size": 16.0,
		"monteclora_config": nil, "layer_replication": nil, "runtime_config": map[string]any{"ephemeral_gpu_offload": false},
		"lora_bias": true, "target_parameters": nil, "use_bdlora": nil, "arrow_config": nil, "ensure_weight_tying": false,
	}
	all := base()
	for k, v := range accepted {
		all[k] = v
		c := base()
		c[k] = v
		if _, err := lora.ReadSettings(c); err != nil {
			t.Errorf("%s = %v: %v, want it accepted", k, v, err)
		}
	}
	cfg, err := lora.ReadSettings(all)
	if err != nil || cfg.Rank != 8 || cfg.Alpha != 16 || !cfg.RSLoRA || cfg.Dropout != 0.1 || !cfg.Bias ||
		cfg.ForLayer("model.layers.0.self_attn.q_proj").Rank != 4 || cfg.ForLayer("model.layers.0.self_attn.q_proj").Alpha != 8 {
		t.Errorf("every field at once: %+v, %v", cfg, err)
	}
	refused := map[string]any{
		"fan_in_fan_out": true, "bias": "lora_only", "init_lora_weights": "olora", "megatron_config": map[string]any{"a": 1.0},
		"trainable_token_indices": []any{1.0}, "loftq_config": map[string]any{"loftq_bits": 4.0}, "corda_config": map[string]any{"x": 1.0},
		"lora_ga_config": map[string]any{"x": 1.0}, "alora_invocation_tokens": []any{3.0}, "use_qalora": true,
		"monteclora_config": map[string]any{"x": 1.0}, "layer_replication": []any{[]any{0.0, 2.0}}, "target_parameters": []any{"experts.w"},
		"use_bdlora": map[string]any{"x": 1.0}, "arrow_config": map[string]any{"top_k": 3.0}, "ensure_weight_tying": true,
		"future_field": "on",
	}
	for k, v := range refused {
		c := base()
		c[k] = v
		if _, err := lora.ReadSettings(c); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s = %v: %v, want a refusal naming it", k, v, err)
		}
	}
	for _, init := range []string{"pissa", "pissa_niter_16", "corda", "loftq", "lora_ga"} {
		if _, err := lora.ReadSettings(adapter.PEFTConfig{"init_lora_weights": init}); err == nil || !strings.Contains(err.Error(), "changes the base weights") {
			t.Errorf("init_lora_weights %q: %v", init, err)
		}
	}
	// rank_pattern with a rank that is not a positive integer.
	if _, err := lora.ReadSettings(adapter.PEFTConfig{"rank_pattern": map[string]any{"q": 2.5}}); err == nil || !strings.Contains(err.Error(), "rank_pattern") {
		t.Errorf("rank_pattern 2.5: %v", err)
	}
}
