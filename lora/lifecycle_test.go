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
