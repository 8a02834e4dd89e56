package lora_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
)

func TestSelectLayers(t *testing.T) {
	cfg, _ := llama.Preset("tiny", 0)
	layers := decoder.LinearLayers(cfg)
	count := func(targets ...string) int {
		sel, err := adapter.SelectLayers(layers, targets)
		if err != nil {
			t.Fatalf("%v: %v", targets, err)
		}
		return len(sel)
	}
	n := cfg.NumHiddenLayers
	for _, tc := range []struct {
		targets []string
		want    int
	}{
		{[]string{"q", "v"}, 2 * n}, {[]string{"q_proj", "v_proj"}, 2 * n}, {[]string{"all-linear"}, 7 * n},
		{[]string{"model.layers.0.self_attn.q_proj"}, 1}, {[]string{"self_attn.o_proj", "mlp"}, 4 * n},
		{[]string{"heads"}, 1}, {[]string{"all-linear", "lm_head"}, 7*n + 1},
	} {
		if got := count(tc.targets...); got != tc.want {
			t.Errorf("%v selects %d layers, want %d", tc.targets, got, tc.want)
		}
	}
	for _, bad := range [][]string{{"query"}, {"q", "nope"}, {}, {""}} {
		_, err := adapter.SelectLayers(layers, bad)
		if err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line", bad, err)
		}
	}
	vcfg, _ := vit.Preset("tiny", 10)
	sel, err := adapter.SelectLayers(vit.LinearLayers(vcfg), []string{"q", "v"})
	if err != nil || len(sel) != 2*vcfg.NumHiddenLayers || !strings.HasSuffix(sel[0].Path, "attention.attention.query") {
		t.Errorf("ViT q,v: %+v, %v", sel, err)
	}
	if _, err := lora.New(lora.Config{Rank: 0, Alpha: 8}); err == nil {
		t.Error("rank 0 accepted")
	}
}

// TestLoRAGradientMatchesHandReference: one linear layer with LoRA (B made non-zero), loss = sum(y * R); the
// gradients of A and B equal the hand-derived dB = s Rᵀ (x Aᵀ), dA = s (R B)ᵀ x.
func TestLoRAGradientMatchesHandReference(t *testing.T) {
	const n, in, out, r = 2, 3, 4, 2
	x := gtest.Rand(1, n*in, 1)
	w := gtest.Rand(2, out*in, 1)
	a := gtest.Rand(3, r*in, 1)
	b := gtest.Rand(4, out*r, 1)
	rr := gtest.Rand(5, n*out, 1)
	cfg := lora.Config{Rank: r, Alpha: 3}
	s := cfg.Scale()
	layer := models.LinearLayer{Path: "l", In: in, Out: out}
	got := gtest.Run(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		y := (&lora.LoRA{Config: cfg}).Forward(adapter.Context{}, layer, p[0], p[1], nil, map[string]*graph.Node{lora.SuffixA: p[2], lora.SuffixB: p[3]})
		grads := engine.Gradient(graph.ReduceAllSum(graph.Mul(y, p[4])), p[2], p[3])
		return append([]*graph.Node{y}, grads...)
	}, gtest.Tensor(x, n, in), gtest.Tensor(w, out, in), gtest.Tensor(a, r, in), gtest.Tensor(b, out, r), gtest.Tensor(rr, n, out))
	ax := make([]float64, n*r) // x Aᵀ
	for i := 0; i < n; i++ {
		for k := 0; k < r; k++ {
			for j := 0; j < in; j++ {
				ax[i*r+k] += float64(x[i*in+j]) * float64(a[k*in+j])
			}
		}
	}
	wantY := make([]float64, n*out)
	wantB := make([]float64, out*r)
	rb := make([]float64, n*r) // R B
	for i := 0; i < n; i++ {
		for o := 0; o < out; o++ {
			for j := 0; j < in; j++ {
				wantY[i*out+o] += float64(x[i*in+j]) * float64(w[o*in+j])
			}
			for k := 0; k < r; k++ {
				wantY[i*out+o] += s * ax[i*r+k] * float64(b[o*r+k])
				wantB[o*r+k] += s * float64(rr[i*out+o]) * ax[i*r+k]
				rb[i*r+k] += float64(rr[i*out+o]) * float64(b[o*r+k])
			}
		}
	}
	wantA := make([]float64, r*in)
	for k := 0; k < r; k++ {
		for j := 0; j < in; j++ {
			for i := 0; i < n; i++ {
				wantA[k*in+j] += s * rb[i*r+k] * float64(x[i*in+j])
			}
		}
	}
	for idx, want := range [][]float64{wantY, wantA, wantB} {
		for i := range want {
			if math.Abs(float64(got[idx][i])-want[i]) > 1e-5 {
				t.Fatalf("output %d [%d] = %g, want %g", idx, i, got[idx][i], want[i])
			}
		}
	}
}

// TestZeroBKeepsBaseLogits: freshly initialised LoRA (B = 0) leaves the model's logits exactly unchanged.
func TestZeroBKeepsBaseLogits(t *testing.T) {
	cfg, _ := llama.Preset("tiny", 0)
	params := decoder.RandomParams(cfg, 3)
	m, err := decoder.New(cfg, params, decoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	newAdapter, _ := lora.New(lora.Config{Rank: 4, Alpha: 8})
	set, err := adapter.NewSet(decoder.LinearLayers(cfg), []string{"all-linear"}, newAdapter, 1, adapter.WeightsOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	ids := tensors.FromFlatDataAndDimensions([]int32{1, 5, 9, 200, 3, 7}, 1, 6)
	run := func(withLoRA bool) []float32 {
		out, _ := gtest.RunBuilt(t, func(g *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
			idsN := graph.Parameter(g, "ids", ids.Shape())
			base := models.Bind(g, m.Params)
			inputs := append([]*tensors.Tensor{ids}, base.Inputs(m.Params)...)
			if withLoRA {
				ad := models.Bind(g, set.Params)
				base = base.Merge(ad)
				base.Linear = set.Hook()
				inputs = append(inputs, ad.Inputs(set.Params)...)
			}
			return []*graph.Node{m.Forward(base, idsN, nil).Logits}, inputs
		})
		return out[0]
	}
	if d := gtest.MaxAbsDiff(run(true), run(false)); d != 0 {
		t.Errorf("logits with B = 0 differ from the base model by %g", d)
	}
}

// TestLoRAFAKeepsOnlyRankTensor: on a frozen layer, LoRA keeps x (for A's gradient) and A x (for B's);
// LoRA-FA keeps only A x, the rank-r tensor.
func TestLoRAFAKeepsOnlyRankTensor(t *testing.T) {
	const n, in, out, r = 5, 16, 12, 2
	x := gtest.Tensor(gtest.Rand(1, n*in, 1), n, in)
	w := gtest.Tensor(gtest.Rand(2, out*in, 1), out, in)
	layer := models.LinearLayer{Path: "l", In: in, Out: out}
	for _, frozenA := range []bool{false, true} {
		cfg := lora.Config{Rank: r, Alpha: 4, FrozenA: frozenA}
		ad := &lora.LoRA{Config: cfg}
		init, _ := ad.Init(layer, nil, rand.New(rand.NewPCG(1, 2)))
		var outputs []*graph.Node
		_, g := gtest.RunGraph(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
			y := ad.Forward(adapter.Context{}, layer, graph.Sin(p[0]), p[1], nil, map[string]*graph.Node{lora.SuffixA: p[2], lora.SuffixB: p[3]})
			wrt := []*graph.Node{p[3]}
			if !frozenA {
				wrt = append(wrt, p[2])
			}
			outputs = engine.Gradient(graph.ReduceAllSum(graph.Square(y)), wrt...)
			return outputs
		}, x, w, init[lora.SuffixA], init[lora.SuffixB])
		saved, err := memory.Saved(g, outputs...)
		if err != nil {
			t.Fatal(err)
		}
		full, rank := len(saved.Find(n, in)), len(saved.Find(n, r))
		if frozenA && (full != 0 || rank != 1) {
			t.Errorf("LoRA-FA keeps %d [n, in] and %d [n, r] tensors, want 0 and 1", full, rank)
		}
		if !frozenA && (full != 1 || rank != 1) {
			t.Errorf("LoRA keeps %d [n, in] and %d [n, r] tensors, want 1 and 1", full, rank)
		}
	}
}
