package llamagguf

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/tokenizer"
)

// TestPermute: the q/k row permutation is llama.cpp's (HF rows [a0 a1 | b0 b1] of a head -> [a0 b0 a1 b1], per
// head, for the head count given), and the inverse undoes it.
func TestPermute(t *testing.T) {
	// 2 heads of head_dim 4, 2 columns: row r holds (10r, 10r+1).
	x := make([]float32, 8*2)
	for r := range 8 {
		x[2*r], x[2*r+1] = float32(10*r), float32(10*r+1)
	}
	got := permute(x, 2, 2, false)
	wantRows := []int{0, 2, 1, 3, 4, 6, 5, 7}
	for i, r := range wantRows {
		if got[2*i] != float32(10*r) || got[2*i+1] != float32(10*r+1) {
			t.Fatalf("row %d holds %v, want HF row %d", i, got[2*i:2*i+2], r)
		}
	}
	if back := permute(got, 2, 2, true); !slices.Equal(back, x) {
		t.Fatalf("inverse: %v", back)
	}
}

func loadLlama(t *testing.T, dir string) (llama.Config, models.Params) {
	t.Helper()
	m, err := llama.Load(dir, llama.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m.Config, m.Params
}

// TestRoundTrip writes the golden GQA LLaMA (untied head, no tokenizer) and llama-tiny with Llama-3.1 rope
// scaling (tied head, byte-level BPE) as GGUF f32, f16 and q8_0, and reads them back: the config is the same,
// f32 tensors are bit for bit the same, f16/q8_0 within their rounding; the file has llama.cpp's names and
// hyperparameters, rope_freqs as the ratio of plain to scaled frequencies, and output.weight only when untied.
func TestRoundTrip(t *testing.T) {
	tmp := t.TempDir()
	gqaCfg, gqa := loadLlama(t, filepath.Join(golden.SharedDir(t), "golden", "llama_a"))
	tinyCfg, tiny := loadLlama(t, filepath.Join("..", "..", "pretrained", "llama-tiny"))
	tinyCfg.RopeTheta = 500000
	tinyCfg.RopeScaling = &llama.RopeScaling{Type: llama.RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 128}
	tok, err := tokenizer.Load(filepath.Join("..", "..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	vocab, err := tok.GGUFVocab(tinyCfg.VocabSize)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		cfg    llama.Config
		params models.Params
		vocab  *tokenizer.GGUFVocab
	}{{"gqa", gqaCfg, gqa, nil}, {"llama3-tied", tinyCfg, tiny, vocab}} {
		for _, typ := range []gguf.TensorType{gguf.F32, gguf.F16, gguf.Q8_0} {
			t.Run(c.name+"-"+typ.String(), func(t *testing.T) {
				path := filepath.Join(tmp, c.name+"-"+typ.String()+".gguf")
				if err := Write(path, c.cfg, c.params, Options{Type: typ, Name: c.name, Vocab: c.vocab}); err != nil {
					t.Fatal(err)
				}
				f, err := gguf.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				for key, want := range map[string]uint64{"llama.block_count": uint64(c.cfg.NumHiddenLayers), "llama.attention.head_count": uint64(c.cfg.NumAttentionHeads),
					"llama.attention.head_count_kv": uint64(c.cfg.NumKeyValueHeads), "llama.rope.dimension_count": uint64(c.cfg.HeadDim),
					"llama.context_length": uint64(c.cfg.MaxPositionEmbeddings), "llama.feed_forward_length": uint64(c.cfg.IntermediateSize),
					"general.file_type": uint64(FileType(typ))} {
					if got, ok, err := f.Uint(key); err != nil || !ok || got != want {
						t.Errorf("%s = %d (%v, %v), want %d", key, got, ok, err, want)
					}
				}
				if eps, _, _ := f.Float("llama.attention.layer_norm_rms_epsilon"); float32(eps) != float32(c.cfg.RMSNormEps) {
					t.Errorf("rms eps %g", eps)
				}
				if _, ok := f.Tensor("output.weight"); ok != !c.cfg.TieWordEmbeddings {
					t.Errorf("output.weight present %v with tie_word_embeddings %v", ok, c.cfg.TieWordEmbeddings)
				}
				q, _ := f.Tensor("blk.0.attn_q.weight")
				down, _ := f.Tensor("blk.0.ffn_down.weight")
				norm, _ := f.Tensor("blk.0.attn_norm.weight")
				if norm.Type != gguf.F32 || q.Type != typ || !slices.Equal(q.Dims, []uint64{uint64(c.cfg.HiddenSize), uint64(c.cfg.NumAttentionHeads * c.cfg.HeadDim)}) {
					t.Errorf("attn_norm %v, attn_q %v %v", norm.Type, q.Type, q.Dims)
				}
				wantDown := typ
				if typ == gguf.Q8_0 && c.cfg.IntermediateSize%32 != 0 {
					wantDown = gguf.F16 // llama.cpp's fallback for rows q8_0 cannot hold
				}
				if down.Type != wantDown {
					t.Errorf("ffn_down (rows of %d) stored as %v", c.cfg.IntermediateSize, down.Type)
				}
				if c.cfg.RopeScaling != nil {
					freqs, err := f.Float32s("rope_freqs.weight")
					if err != nil {
						t.Fatal(err)
					}
					plain := c.cfg
					plain.RopeScaling = nil
					base, scaled := plain.InvFreq(), c.cfg.InvFreq()
					if freqs[0] != 1 || math.Abs(float64(freqs[len(freqs)-1])-8) > 1e-5 {
						t.Errorf("rope_freqs %v: want 1 for the highest frequency, 8 for the lowest", freqs)
					}
					for i := range freqs {
						if math.Abs(float64(base[i]/freqs[i]-scaled[i])) > 1e-6*float64(base[i]) {
							t.Errorf("rope_freqs[%d] = %g: base/factor %g, scaled %g", i, freqs[i], base[i]/freqs[i], scaled[i])
						}
					}
				}
				m, err := Read(path)
				if err != nil {
					t.Fatal(err)
				}
				want := c.cfg
				want.EOSTokenIDs = m.Config.EOSTokenIDs
				if c.vocab == nil {
					want.EOSTokenIDs = []int{want.EOSTokenID}
				}
				want.Unknown = nil
				got := m.Config
				if got.RopeScaling != nil && want.RopeScaling != nil && *got.RopeScaling == *want.RopeScaling {
					got.RopeScaling = want.RopeScaling
				}
				if a, b := mustJSON(t, got), mustJSON(t, want); a != b {
					t.Errorf("config\n got %s\nwant %s", a, b)
				}
				for _, name := range c.params.Names() {
					w, _ := c.params.Float32s(name)
					g, err := m.Params.Float32s(name)
					if err != nil {
						t.Fatal(err)
					}
					var amax float64
					for _, v := range w {
						amax = max(amax, math.Abs(float64(v)))
					}
					tol := map[gguf.TensorType]float64{gguf.F32: 0, gguf.F16: amax * 0x1p-11, gguf.Q8_0: amax/127*0.5 + amax*0x1p-10}[typ]
					if len(m.Params.Dims(name)) == 1 {
						tol = 0
					}
					for i := range w {
						if d := math.Abs(float64(g[i] - w[i])); d > tol {
							t.Fatalf("%s[%d] = %g, want %g (%s, tolerance %g)", name, i, g[i], w[i], typ, tol)
						}
					}
				}
				if c.vocab != nil {
					ids := tok.Encode("Once upon a time, there was a llama.", true)
					if back := m.Tokenizer.Encode("Once upon a time, there was a llama.", true); !slices.Equal(back, ids) {
						t.Errorf("tokenizer: %v, want %v", back, ids)
					}
				}
			})
		}
	}
}

func mustJSON(t *testing.T, c llama.Config) string {
	t.Helper()
	b, err := c.JSON()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadRefuses: a GGUF of another architecture, or with a tensor a LLaMA does not have, is one error.
func TestReadRefuses(t *testing.T) {
	tmp := t.TempDir()
	p := filepath.Join(tmp, "x.gguf")
	ts := []gguf.Tensor{{Info: gguf.TensorInfo{Name: "token_embd.weight", Dims: []uint64{4, 8}, Type: gguf.F32}, Values: func() ([]float32, error) { return make([]float32, 32), nil }}}
	if err := gguf.WriteFile(p, []gguf.KV{{Key: "general.architecture", Value: "qwen2"}}, ts); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p); err == nil || !strings.Contains(err.Error(), `general.architecture is "qwen2"`) {
		t.Fatalf("qwen2: %v", err)
	}
	if err := gguf.WriteFile(p, []gguf.KV{{Key: "general.architecture", Value: "llama"}}, ts); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p); err == nil || !strings.Contains(err.Error(), "no llama.embedding_length") {
		t.Fatalf("no hyperparameters: %v", err)
	}
}
