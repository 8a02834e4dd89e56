package encoder_test

import (
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/encoder"
)

// TestLoadHubLayouts: checkpoints as the Hub stores them load to the same parameters: old BERT names
// (LayerNorm.gamma/beta), a bare encoder saved without its "bert." prefix and with a pooler, and a pretraining
// checkpoint (BertForPreTraining: next-sentence head, pooler, the tied decoder stored, position_ids buffer) read
// as its masked LM.
func TestLoadHubLayouts(t *testing.T) {
	g := golden.Load(t, "bert_a")
	ref, err := encoder.Load(g.Dir, encoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := ref.Config
	save := func(cfg encoder.Config, p models.Params) string {
		dir := t.TempDir()
		j, err := cfg.JSON()
		if err != nil {
			t.Fatal(err)
		}
		if err := models.SaveCheckpoint(dir, j, p, 0); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	same := func(what string, got, want models.Params) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: %d parameters, want %d", what, len(got), len(want))
		}
		for n, v := range want {
			if got[n] == nil || gtest.MaxAbsDiff(gtest.Float32s(got[n]), gtest.Float32s(v)) != 0 {
				t.Errorf("%s: %s differs or is missing", what, n)
			}
		}
	}

	gammaBeta := models.Params{}
	for n, v := range ref.Params {
		n = strings.Replace(strings.Replace(n, "LayerNorm.weight", "LayerNorm.gamma", 1), "LayerNorm.bias", "LayerNorm.beta", 1)
		gammaBeta[n] = v
	}
	m, err := encoder.Load(save(c, gammaBeta), encoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	same("gamma/beta names", m.Params, ref.Params)

	bare := c
	bare.Head, bare.Labels, bare.Architecture = encoder.HeadNone, nil, "BertModel"
	noPrefix, want := models.Params{}, models.Params{}
	for n, v := range ref.Params {
		if strings.HasPrefix(n, "bert.") {
			noPrefix[strings.TrimPrefix(n, "bert.")] = v
			if !strings.HasPrefix(n, "bert.pooler.") {
				want[n] = v
			}
		}
	}
	m, err = encoder.Load(save(bare, noPrefix), encoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	same("BertModel without prefix", m.Params, want)

	pre := c
	pre.Head, pre.Labels, pre.Architecture = encoder.HeadMaskedLM, nil, "BertForPreTraining"
	mlm := encoder.RandomParams(pre, 3)
	stored := models.Params{}
	for n, v := range mlm {
		stored[n] = v
	}
	stored["cls.predictions.decoder.weight"] = mlm["bert.embeddings.word_embeddings.weight"]
	stored["cls.seq_relationship.weight"] = gtest.Tensor(gtest.Rand(1, 2*c.HiddenSize, 1), 2, c.HiddenSize)
	stored["cls.seq_relationship.bias"] = gtest.Tensor(gtest.Rand(2, 2, 1), 2)
	stored["bert.pooler.dense.weight"] = ref.Params["bert.pooler.dense.weight"]
	stored["bert.pooler.dense.bias"] = ref.Params["bert.pooler.dense.bias"]
	m, err = encoder.Load(save(pre, stored), encoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	same("BertForPreTraining as its masked LM", m.Params, mlm)

	// A checkpoint missing a tensor the config needs is refused naming it.
	delete(gammaBeta, "classifier.weight")
	if _, err := encoder.Load(save(c, gammaBeta), encoder.Options{}); err == nil || !strings.Contains(err.Error(), "classifier.weight") {
		t.Errorf("missing classifier: %v", err)
	}
}

// TestFoldUnfold: MS-LN folds every LayerNorm (the shared ones keep their tensors, the last layer's leaves the
// model into the head), and undoing the folds gives back transformers' parameters (float32 rounding of W g / g).
func TestFoldUnfold(t *testing.T) {
	for _, name := range []string{"roberta_a", "bert_a"} {
		g := golden.Load(t, name)
		plain, err := encoder.Load(g.Dir, encoder.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ms, err := encoder.Load(g.Dir, encoder.Options{MSNorm: true})
		if err != nil {
			t.Fatal(err)
		}
		c := plain.Config
		last := c.LayerPrefix(c.NumHiddenLayers-1) + encoder.OutputNorm + ".weight"
		if _, ok := ms.Params[last]; ok {
			t.Errorf("%s: the last LayerNorm folded into the head is still a parameter", name)
		}
		if _, ok := ms.Params[c.LayerPrefix(0)+encoder.OutputNorm+".weight"]; !ok {
			t.Errorf("%s: a shared LayerNorm left the parameters", name)
		}
		if len(ms.Folded) != 2*(2*c.NumHiddenLayers+1) {
			t.Errorf("%s: %d folded norm tensors, want %d", name, len(ms.Folded), 2*(2*c.NumHiddenLayers+1))
		}
		back, err := models.UndoFolds(ms.Params, encoder.Folds(c), ms.Folded, false)
		if err != nil {
			t.Fatal(err)
		}
		for n, v := range ms.Folded {
			if _, ok := back[n]; !ok {
				back[n] = v
			}
		}
		if len(back) != len(plain.Params) {
			t.Errorf("%s: %d parameters after unfolding, want %d", name, len(back), len(plain.Params))
		}
		for n, v := range plain.Params {
			if d := golden.RelMaxDiff(gtest.Float32s(back[n]), gtest.Float32s(v)); d > 1e-6 {
				t.Errorf("%s: %s comes back %g off (relative)", name, n, d)
			}
		}
	}
}
