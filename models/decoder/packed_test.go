package decoder_test

import (
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
)

// TestForwardPackedMatchesAlone: a row packing three documents (5, 4 and 2 tokens, then one padding token) with
// position_ids restarting at each gives, at every real token, the logits of that document run alone in a row of
// its own (positions from 0, nothing else to attend to), with both attention kinds, within float32 rounding
// (1.5e-7 measured; the products have other shapes). A model that attended across documents differs from the
// second document on (checked below). Restarting the positions is not what this test can see: rotary attention
// depends on relative positions only, so a document shifted by a few positions differs by rounding alone; the
// restart matters for long rows, where float32 angles of large positions round differently, and makes a packed
// example's computation the one it has alone, as transformers' packing does.
func TestForwardPackedMatchesAlone(t *testing.T) {
	cfg, err := llama.Preset("tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	docs := [][]int32{{5, 9, 17, 3, 200}, {41, 7, 8, 99}, {13, 2}}
	var ids, pos, mask []int32
	for _, d := range docs {
		for j, id := range d {
			ids, pos, mask = append(ids, id), append(pos, int32(j)), append(mask, 1)
		}
	}
	ids, pos, mask = append(ids, 0), append(pos, 0), append(mask, 0) // padding: a segment of its own
	n := len(ids)
	for _, kind := range []attention.Kind{attention.KindStandard, attention.KindMemoryEfficient} {
		m, err := decoder.New(cfg, randomish(cfg, 3), decoder.Options{Attention: kind})
		if err != nil {
			t.Fatal(err)
		}
		logits := func(ids, mask, pos []int32) []float32 {
			inputs := []*tensors.Tensor{tensors.FromFlatDataAndDimensions(ids, 1, len(ids)), tensors.FromFlatDataAndDimensions(mask, 1, len(ids))}
			if pos != nil {
				inputs = append(inputs, tensors.FromFlatDataAndDimensions(pos, 1, len(ids)))
			}
			values, _ := gtest.RunBuilt(t, func(g *graph.Graph) ([]*graph.Node, []*tensors.Tensor) {
				idsN := graph.Parameter(g, "input_ids", inputs[0].Shape())
				maskN := graph.Parameter(g, "attention_mask", inputs[1].Shape())
				var posN *graph.Node
				if pos != nil {
					posN = graph.Parameter(g, "position_ids", inputs[2].Shape())
				}
				bound := models.Bind(g, m.Params)
				return []*graph.Node{m.ForwardPacked(bound, idsN, maskN, posN).Logits}, append(inputs, bound.Inputs(m.Params)...)
			})
			return values[0]
		}
		packed := logits(ids, mask, pos)
		vocab := len(packed) / n
		off := 0
		for k, d := range docs {
			ones := make([]int32, len(d))
			for i := range ones {
				ones[i] = 1
			}
			alone := logits(d, ones, nil)
			if diff := gtest.MaxAbsDiff(packed[off*vocab:(off+len(d))*vocab], alone); diff > 1e-6 {
				t.Errorf("%s: document %d's logits packed differ from alone by %g", kind, k, diff)
			}
			off += len(d)
		}
		// Without position_ids the same row is one document: the later documents' logits differ.
		plain := logits(ids, mask, nil)
		if diff := gtest.MaxAbsDiff(plain[5*vocab:9*vocab], packed[5*vocab:9*vocab]); diff < 1e-3 {
			t.Errorf("%s: the second document's logits are the same with and without position_ids (%g)", kind, diff)
		}
	}
}
