package all_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/gguf/decodergguf"
	"github.com/memfit/memfit/models/decoder"
)

// ggufReady returns the family's tiny preset as llama.cpp's architecture takes it (Gemma's sliding pattern and
// score scale, which llama.cpp hard-codes) and the variants the writer has more to say about (Phi-3 longrope).
func ggufReady(t *testing.T, family string) []decoder.Config {
	fam, _ := finetune.FamilyByName(family)
	m, err := fam.Preset("tiny", 0, finetune.ModelOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := m.(lm.Model).Config
	switch family {
	case "gemma2":
		c.QueryPreAttnScalar = float64(c.HeadDim)
	case "gemma3_text":
		c.Sliding = []bool{true, true, true}
	case "phi3":
		long := c
		long.MaxPositionEmbeddings = 256
		long.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLongRope, ShortFactor: []float64{1, 1.5, 2, 3, 4, 5},
			LongFactor: []float64{1.25, 2, 3.5, 5, 7, 9}, OriginalMaxPositionEmbeddings: 64, Factor: 4}
		long.Sliding, long.SlidingWindow = []bool{true, true}, 48
		return []decoder.Config{c, long}
	}
	return []decoder.Config{c}
}

// TestFamilyGGUFRoundTrip: each decoder family's GGUF export (its llama.cpp architecture, f32) reads back as the
// same config and the same tensors, bit for bit (Gemma's 1 + w and the llama permutation undone); what a
// family's architecture cannot carry is refused with one line; the sliding window of an architecture llama.cpp
// runs with full attention is noted.
func TestFamilyGGUFRoundTrip(t *testing.T) {
	for _, family := range decoderFamilies {
		fam, _ := finetune.FamilyByName(family)
		for i, c := range ggufReady(t, family) {
			params := decoder.RandomParams(c, uint64(i+1))
			m, err := decoder.New(c, params, decoder.Options{})
			if err != nil {
				t.Fatal(err)
			}
			model := lmModel(family, m)
			path := filepath.Join(t.TempDir(), family+".gguf")
			var notes []string
			if err := finetune.ExportGGUF(path, model, params, nil, decodergguf.Options{Note: func(n string) { notes = append(notes, n) }}); err != nil {
				t.Fatalf("%s: %v", family, err)
			}
			back, gotFam, err := finetune.LoadGGUF(path, finetune.ModelOptions{})
			if err != nil {
				t.Fatalf("%s: %v", family, err)
			}
			wantFam := family
			if family == "mistral" {
				wantFam = "llama" // llama.cpp's llama architecture, as its converter writes Mistral
			}
			if gotFam.Name != wantFam {
				t.Errorf("%s: read back as %s", family, gotFam.Name)
			}
			got := back.(lm.Model).Config
			want := c
			want.EOSTokenIDs = got.EOSTokenIDs // a GGUF without tokenizer keeps one eos id
			if !slices.Contains(want.Sliding, true) {
				want.Sliding, got.Sliding = nil, nil
			}
			if a, b := js(t, got), js(t, want); a != b {
				t.Errorf("%s: config\n got %s\nwant %s", family, a, b)
			}
			for _, name := range params.Names() {
				w, _ := params.Float32s(name)
				g, err := back.Params().Float32s(name)
				if err != nil || !slices.Equal(w, g) {
					t.Errorf("%s: %s differs after the round trip (%v)", family, name, err)
				}
			}
			if (len(notes) > 0) != (slices.Contains(c.Sliding, true) && fam.GGUFArchs[0] != "gemma2" && fam.GGUFArchs[0] != "gemma3") {
				t.Errorf("%s: notes %q", family, notes)
			}
		}
	}
	for _, bad := range []struct {
		family string
		edit   func(c *decoder.Config)
		want   string
	}{
		{"gemma2", func(c *decoder.Config) { c.QueryPreAttnScalar = 24 }, "scales the scores by 1/sqrt(16); this model's query_pre_attn_scalar is 24"},
		{"gemma3_text", func(c *decoder.Config) { c.Sliding = []bool{true, false, true} }, "differ at layer 1"},
		{"gemma3_text", func(c *decoder.Config) { c.LocalRopeTheta = 5000 }, "rope_local_base_freq is 5000"},
		{"qwen2", func(c *decoder.Config) {
			c.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
		}, "llama.cpp's qwen2 architecture has no llama3 rope scaling"},
	} {
		c := ggufReady(t, bad.family)[0]
		bad.edit(&c)
		m, err := decoder.New(c, decoder.RandomParams(c, 1), decoder.Options{})
		if err != nil {
			t.Fatal(err)
		}
		err = finetune.CheckGGUF(lmModel(bad.family, m))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.family, err, bad.want)
		}
	}
}

// lmModel wraps m as a model of the named family.
func lmModel(family string, m *decoder.Model) finetune.Model {
	fam, _ := finetune.FamilyByName(family)
	shaped, _ := fam.Preset("tiny", 0, finetune.ModelOptions{})
	return lm.Model{Model: m, Spec: shaped.(lm.Model).Spec}
}

func js(t *testing.T, c decoder.Config) string {
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
