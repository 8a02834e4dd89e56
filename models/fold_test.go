package models_test

import (
	"testing"

	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
)

// TestFoldsUndo: ApplyFolds then UndoFolds gives back every linear layer (a LayerNorm with a shift into a layer
// with a bias and one without), NormOf finds the folded norm, and a quantised weight takes the fold exactly as
// its float value would (msnorm.Fold of the dequantised weight).
func TestFoldsUndo(t *testing.T) {
	const in, out = 8, 3
	gamma := gtest.Rand(1, in, 0.5)
	for i := range gamma {
		gamma[i] += 1
	}
	p := models.Params{
		"norm.weight": gtest.Tensor(gamma, in), "norm.bias": gtest.Tensor(gtest.Rand(2, in, 1), in),
		"a.weight": gtest.Tensor(gtest.Rand(3, out*in, 1), out, in), "a.bias": gtest.Tensor(gtest.Rand(4, out, 1), out),
		"b.weight": gtest.Tensor(gtest.Rand(5, out*in, 1), out, in),
	}
	folds := []models.Fold{{Gamma: "norm.weight", Beta: "norm.bias", Linears: []models.Linear{{Weight: "a.weight", Bias: "a.bias"}, {Weight: "b.weight", Bias: "b.bias"}}}}
	arch := map[string][]int{"a.weight": {out, in}, "b.weight": {out, in}}
	folded, removed, err := models.ApplyFolds(p, folds, arch)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := folded["b.bias"]; !ok {
		t.Fatal("folding a shift into a layer without bias must add one")
	}
	if norm, ok, err := models.NormOf(folds, removed, "b.weight"); !ok || err != nil || len(norm.Beta) != in {
		t.Fatalf("NormOf(b.weight) = %v, %v", ok, err)
	}
	back, err := models.UndoFolds(folded, folds, removed, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a.weight", "a.bias", "b.weight"} {
		if d := gtest.MaxAbsDiff(gtest.Float32s(back[n]), gtest.Float32s(p[n])); d > 1e-5 {
			t.Errorf("%s comes back %g off", n, d)
		}
	}
	if d := gtest.MaxAbsDiff(gtest.Float32s(back["b.bias"]), make([]float32, out)); d > 1e-5 {
		t.Errorf("the bias folding added comes back as %g, want 0", d)
	}

	q, err := quant.QuantizeWeights(p, []quant.LinearWeight{{Name: "a.weight", Out: out, In: in}})
	if err != nil {
		t.Fatal(err)
	}
	qf, _, err := models.ApplyFolds(q, folds, arch)
	if err != nil {
		t.Fatal(err)
	}
	nf4, ok, err := quant.FromTensors(qf, "a.weight", out, in)
	if !ok || err != nil {
		t.Fatalf("folded NF4 weight: %v, %v", ok, err)
	}
	plain, ok, _ := quant.FromTensors(q, "a.weight", out, in)
	ref, _, err := models.ApplyFolds(models.Params{"norm.weight": p["norm.weight"], "norm.bias": p["norm.bias"],
		"a.weight": gtest.Tensor(plain.Dequantize(), out, in), "a.bias": p["a.bias"], "b.weight": p["b.weight"]}, folds, nil)
	if err != nil || !ok {
		t.Fatal(err)
	}
	if d := gtest.MaxAbsDiff(nf4.Dequantize(), gtest.Float32s(ref["a.weight"])); d > 1e-6 {
		t.Errorf("NF4 folding differs from folding the dequantised weight by %g", d)
	}
	if d := gtest.MaxAbsDiff(gtest.Float32s(qf["a.bias"]), gtest.Float32s(ref["a.bias"])); d > 1e-6 {
		t.Errorf("NF4 folding's bias differs by %g", d)
	}
}

// TestSharedFold: a Shared fold (a post-LN norm whose output is also the residual stream) keeps the norm's tensors
// among the parameters, and unfolding uses the norm's tensors as the parameters hold them (trained) rather than
// as they were folded: W = W' diag(1/g_now).
func TestSharedFold(t *testing.T) {
	const in, out = 6, 2
	gamma := gtest.Rand(7, in, 0.3)
	for i := range gamma {
		gamma[i] += 1
	}
	p := models.Params{"norm.weight": gtest.Tensor(gamma, in), "norm.bias": gtest.Tensor(gtest.Rand(8, in, 1), in),
		"a.weight": gtest.Tensor(gtest.Rand(9, out*in, 1), out, in), "a.bias": gtest.Tensor(gtest.Rand(10, out, 1), out)}
	folds := []models.Fold{{Gamma: "norm.weight", Beta: "norm.bias", Shared: true, Linears: []models.Linear{{Weight: "a.weight", Bias: "a.bias"}}}}
	folded, removed, err := models.ApplyFolds(p, folds, nil)
	if err != nil {
		t.Fatal(err)
	}
	if folded["norm.weight"] == nil || folded["norm.bias"] == nil || removed["norm.weight"] == nil {
		t.Fatal("a shared fold must keep the norm's tensors and record them")
	}
	if s := models.FoldedShapes(map[string][]int{"norm.weight": {in}, "norm.bias": {in}, "a.weight": {out, in}, "a.bias": {out}}, folds); s["norm.weight"] == nil {
		t.Error("FoldedShapes dropped a shared norm")
	}
	// Training moved gamma to 2*gamma: the folded layer reads z, so its original-basis weight is W' / (2 gamma).
	trained := models.Params{}
	for n, v := range folded {
		trained[n] = v
	}
	doubled := make([]float32, in)
	for i, g := range gamma {
		doubled[i] = 2 * g
	}
	trained["norm.weight"] = gtest.Tensor(doubled, in)
	back, err := models.UndoFolds(trained, folds, removed, false)
	if err != nil {
		t.Fatal(err)
	}
	w, fw := gtest.Float32s(back["a.weight"]), gtest.Float32s(folded["a.weight"])
	for r := 0; r < out; r++ {
		for i := 0; i < in; i++ {
			if want := fw[r*in+i] / doubled[i]; w[r*in+i]-want > 1e-6 || want-w[r*in+i] > 1e-6 {
				t.Fatalf("a.weight[%d,%d] = %g, want %g", r, i, w[r*in+i], want)
			}
		}
	}
}
