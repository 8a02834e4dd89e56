package vit_test

import (
	"fmt"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
)

const (
	batch, tokens, hidden, mlp, heads = 2, 7, 16, 64, 4
	eps                               = 1e-6
)

type built struct {
	outputs []*graph.Node
	out     *graph.Node
	grads   map[string]*graph.Node
	g       *graph.Graph
}

// buildStep builds loss = sum(Block(x) * target) with gradients for x and every weight of params.
func buildStep(t *testing.T, params vit.LayerParams, opt vit.BlockOptions, x, target *tensors.Tensor) (built, [][]float32) {
	t.Helper()
	names := params.Names()
	inputs := []*tensors.Tensor{x, target}
	for _, n := range names {
		inputs = append(inputs, params[n])
	}
	var b built
	res, g := gtest.RunGraph(t, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		nodes := map[string]*graph.Node{}
		for i, n := range names {
			nodes[n] = p[2+i]
		}
		b.out = vit.Block(p[0], models.Bound{Nodes: nodes}, "", opt)
		loss := graph.ReduceAllSum(graph.Mul(b.out, p[1]))
		wrt := append([]*graph.Node{p[0]}, p[2:]...)
		grads := engine.Gradient(loss, wrt...)
		b.grads = map[string]*graph.Node{"x": grads[0]}
		for i, n := range names {
			b.grads[n] = grads[1+i]
		}
		b.outputs = append([]*graph.Node{b.out}, grads...)
		return b.outputs
	}, inputs...)
	b.g = g
	return b, res
}

func inputs() (*tensors.Tensor, *tensors.Tensor) {
	return gtest.Tensor(gtest.Rand(1, batch*tokens*hidden, 1), batch, tokens, hidden),
		gtest.Tensor(gtest.Rand(2, batch*tokens*hidden, 1), batch, tokens, hidden)
}

// TestFourModesAgree: the same layer computes the same output and input gradient in all four modes (exact in
// the forward for every mode; the backward is exact for MS-LN and approximate for ReGELU2, so only the MS-LN
// pair is compared there).
func TestFourModesAgree(t *testing.T) {
	params := vit.RandomLayer(3, hidden, mlp)
	folded, err := vit.FoldLayer(params)
	if err != nil {
		t.Fatal(err)
	}
	x, target := inputs()
	results := map[string][][]float32{}
	for _, approx := range []bool{false, true} {
		for _, ms := range []bool{false, true} {
			p := params
			if ms {
				p = folded
			}
			_, res := buildStep(t, p, vit.BlockOptions{Heads: heads, Eps: eps, ApproxActivation: approx, MSNorm: ms}, x, target)
			results[fmt.Sprintf("approx=%v,ms=%v", approx, ms)] = res
		}
	}
	base := results["approx=false,ms=false"]
	for name, res := range results {
		if d := gtest.MaxAbsDiff(res[0], base[0]); d > 2e-5 {
			t.Errorf("%s: output differs from GELU+LN by %g", name, d)
		}
	}
	for _, approx := range []bool{false, true} {
		plain := results[fmt.Sprintf("approx=%v,ms=false", approx)]
		ms := results[fmt.Sprintf("approx=%v,ms=true", approx)]
		if d := gtest.MaxRelDiff(ms[1], plain[1], 1); d > 1e-5 {
			t.Errorf("approx=%v: MS-LN input gradient differs from LN by %g (relative)", approx, d)
		}
	}
	if d := gtest.MaxAbsDiff(results["approx=true,ms=false"][1], base[1]); d == 0 {
		t.Error("ReGELU2 gave exactly the GELU input gradient: the approximate backward is not in use")
	}
}

// TestReGELU2KeepsNoHiddenFloat: with ReGELU2 the backward reads no float tensor of the MLP hidden shape except
// the down projection's input; with GELU it also keeps the activation input.
func TestReGELU2KeepsNoHiddenFloat(t *testing.T) {
	x, target := inputs()
	for _, approx := range []bool{false, true} {
		b, _ := buildStep(t, vit.RandomLayer(4, hidden, mlp), vit.BlockOptions{Heads: heads, Eps: eps, ApproxActivation: approx}, x, target)
		saved, err := memory.Saved(b.g, b.outputs...)
		if err != nil {
			t.Fatal(err)
		}
		var hiddenFloats []memory.SavedTensor
		for _, s := range saved.Find(batch, tokens, mlp) {
			if s.Shape.DType.IsFloat() {
				hiddenFloats = append(hiddenFloats, s)
			}
		}
		wantFloats := 2 // GELU input + down projection input
		if approx {
			wantFloats = 1 // down projection input only
			codes := saved.Find((batch*tokens*mlp + 3) / 4)
			if len(codes) != 1 || codes[0].Shape.DType != dtypes.Uint8 || codes[0].Kind != engine.KindActivation {
				t.Errorf("ReGELU2: want exactly one packed uint8 code tensor of %d bytes, got %+v", (batch*tokens*mlp+3)/4, codes)
			}
		}
		if len(hiddenFloats) != wantFloats {
			t.Errorf("approx=%v: %d float tensors of the MLP hidden shape saved, want %d: %+v", approx, len(hiddenFloats), wantFloats, hiddenFloats)
		}
		for _, s := range hiddenFloats {
			if approx && s.Kind != engine.KindLinear {
				t.Errorf("ReGELU2: hidden-shaped float tensor kept for %v (read by %v), want only the linear input", s.Kind, s.ReadBy)
			}
		}
	}
}

// TestMSNormSharesTensor: with MS-LN each norm's output is kept once, read by both the norm's backward and the
// following linear layers, and no other [B, N, D] tensor is kept for the norms; with plain LN the norm keeps z
// and the linear layers keep the affine output, two tensors.
func TestMSNormSharesTensor(t *testing.T) {
	x, target := inputs()
	params := vit.RandomLayer(5, hidden, mlp)
	folded, err := vit.FoldLayer(params)
	if err != nil {
		t.Fatal(err)
	}
	for _, ms := range []bool{false, true} {
		p := params
		if ms {
			p = folded
		}
		b, _ := buildStep(t, p, vit.BlockOptions{Heads: heads, Eps: eps, MSNorm: ms}, x, target)
		saved, err := memory.Saved(b.g, b.outputs...)
		if err != nil {
			t.Fatal(err)
		}
		var shared, normOnly, linearOnly int
		for _, s := range saved.Find(batch, tokens, hidden) {
			readByNorm, readByLinear := false, false
			for _, k := range s.ReadBy {
				readByNorm = readByNorm || k == engine.KindNorm
				readByLinear = readByLinear || k == engine.KindLinear
			}
			switch {
			case readByNorm && readByLinear:
				shared++
			case readByNorm:
				normOnly++
			case readByLinear && s.Producer == engine.KindNorm:
				linearOnly++
			}
		}
		if ms && (shared != 2 || normOnly != 0 || linearOnly != 0) {
			t.Errorf("MS-LN: %d shared norm/linear tensors (want 2), %d norm-only (want 0), %d linear-only norm outputs (want 0)", shared, normOnly, linearOnly)
		}
		if !ms && (shared != 0 || normOnly != 2 || linearOnly != 2) {
			t.Errorf("LN: %d shared (want 0), %d norm-only z (want 2), %d affine outputs kept by linears (want 2)", shared, normOnly, linearOnly)
		}
		if ms && saved.ByKind[engine.KindNorm] != 2*int64(batch*tokens*4) {
			t.Errorf("MS-LN: norm kind charged %d bytes, want only the two rstd vectors (%d)", saved.ByKind[engine.KindNorm], 2*batch*tokens*4)
		}
	}
}
