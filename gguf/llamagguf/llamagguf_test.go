package llamagguf

import (
	"encoding/json"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/hfconfig"
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

// loadLlama loads a LLaMA folder (the config's shared fields are all a LLaMA of these tests has: family/llama,
// which decodes the rest, imports this package).
func loadLlama(t *testing.T, dir string) (decoder.Config, models.Params) {
	t.Helper()
	m, err := decoder.Load(dir, func(f hfconfig.Fields) (decoder.Config, error) {
		d := hfconfig.NewDecoder(f)
		c := decoder.Config{RMSNormEps: 1e-6, RopeTheta: 10000, PadTokenID: -1, BOSTokenID: -1, EOSTokenID: -1}
		decoder.ReadCommon(d, &c)
		d.Ignore("model_type", "architectures", "hidden_act", "attention_bias", "mlp_bias", "pretraining_tp")
		return c, decoder.Finish(d, &c)
	}, decoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m.Config, m.Params
}

// TestRoundTrip writes the golden GQA LLaMA (untied head, no tokenizer) and llama-tiny with Llama-3.1 rope
// scaling (tied head, byte-level BPE) as GGUF f32, f16, bf16 and q8_0, and reads them back: the config is the same,
// f32 tensors are bit for bit the same, f16/bf16/q8_0 within their rounding; the file has llama.cpp's names and
// hyperparameters, rope_freqs as the ratio of plain to scaled frequencies, and output.weight only when untied.
func TestRoundTrip(t *testing.T) {
	tmp := t.TempDir()
	gqaCfg, gqa := loadLlama(t, filepath.Join(golden.SharedDir(t), "golden", "llama_a"))
	tinyCfg, tiny := loadLlama(t, filepath.Join("..", "..", "pretrained", "llama-tiny"))
	tinyCfg.RopeTheta = 500000
	tinyCfg.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 128}
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
		cfg    decoder.Config
		params models.Params
		vocab  *tokenizer.GGUFVocab
	}{{"gqa", gqaCfg, gqa, nil}, {"llama3-tied", tinyCfg, tiny, vocab}} {
		for _, typ := range []gguf.TensorType{gguf.F32, gguf.F16, gguf.BF16, gguf.Q8_0} {
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
					tol := map[gguf.TensorType]float64{gguf.F32: 0, gguf.F16: amax * 0x1p-11, gguf.BF16: amax * 0x1p-8, gguf.Q8_0: amax/127*0.5 + amax*0x1p-10}[typ]
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

func mustJSON(t *testing.T, c decoder.Config) string {
	t.Helper()
	b, err := json.Marshal(c)
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
	if err := gguf.WriteFile(p, []gguf.KV{{Key: "general.architecture", Value: "bert"}}, ts); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p); err == nil || !strings.Contains(err.Error(), `general.architecture is "bert"`) {
		t.Fatalf("bert: %v", err)
	}
	if err := gguf.WriteFile(p, []gguf.KV{{Key: "general.architecture", Value: "llama"}}, ts); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p); err == nil || !strings.Contains(err.Error(), "no llama.embedding_length") {
		t.Fatalf("no hyperparameters: %v", err)
	}
}

// TestLlama3FromConverterFile: a GGUF with rope_freqs but without memfit's keys (as llama.cpp's converter writes
// Llama 3.x) is read with the Llama-3.1 scaling found from the factors; factors no such scaling gives are refused.
func TestLlama3FromConverterFile(t *testing.T) {
	tmp := t.TempDir()
	cfg, params := loadLlama(t, filepath.Join("..", "..", "pretrained", "llama-tiny"))
	cfg.RopeTheta = 500000
	cfg.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLlama3, Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 256}
	ours := filepath.Join(tmp, "memfit.gguf")
	if err := Write(ours, cfg, params, Options{Type: gguf.F32}); err != nil {
		t.Fatal(err)
	}
	strip := func(out string, edit func(name string, x []float32)) {
		f, err := gguf.Open(ours)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var meta []gguf.KV
		for _, kv := range f.Meta {
			if !strings.HasPrefix(kv.Key, "memfit.") {
				meta = append(meta, kv)
			}
		}
		var ts []gguf.Tensor
		for _, ti := range f.Tensors {
			ts = append(ts, gguf.Tensor{Info: gguf.TensorInfo{Name: ti.Name, Dims: ti.Dims, Type: ti.Type}, Values: func() ([]float32, error) {
				x, err := f.Float32s(ti.Name)
				if err == nil && edit != nil {
					edit(ti.Name, x)
				}
				return x, err
			}})
		}
		if err := gguf.WriteFile(out, meta, ts); err != nil {
			t.Fatal(err)
		}
	}
	conv := filepath.Join(tmp, "converter.gguf")
	strip(conv, nil)
	m, err := Read(conv)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Config.RopeScaling; got == nil || !reflect.DeepEqual(*got, *cfg.RopeScaling) {
		t.Fatalf("rope scaling read as %+v, want %+v", got, cfg.RopeScaling)
	}
	odd := filepath.Join(tmp, "odd.gguf")
	strip(odd, func(name string, x []float32) {
		if name == "rope_freqs.weight" {
			x[3] = 1.5
		}
	})
	if _, err := Read(odd); err == nil || !strings.Contains(err.Error(), "match no Llama-3.1 rope scaling") {
		t.Fatalf("odd rope factors: %v", err)
	}
}

// TestBiasesRoundTrip: a LLaMA with attention and MLP biases (attention_bias, mlp_bias) keeps them, the q/k
// biases permuted with their rows and back, bit for bit.
func TestBiasesRoundTrip(t *testing.T) {
	cfg := decoder.Config{VocabSize: 40, HiddenSize: 32, IntermediateSize: 48, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		HeadDim: 8, MaxPositionEmbeddings: 32, RMSNormEps: 1e-6, RopeTheta: 10000, PadTokenID: -1, BOSTokenID: 1, EOSTokenID: 2,
		Task: decoder.CausalLM, AttentionBias: true, MLPBias: true}
	params := decoder.RandomParams(cfg, 3)
	for _, name := range params.Names() {
		if strings.HasSuffix(name, ".bias") {
			n := params.Dims(name)[0]
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(i) - float32(n)/3
			}
			params[name] = tensors.FromFlatDataAndDimensions(x, n)
		}
	}
	p := filepath.Join(t.TempDir(), "bias.gguf")
	if err := Write(p, cfg, params, Options{Type: gguf.F32}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	qb, err := f.Float32s("blk.1.attn_q.bias")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	hf, _ := params.Float32s(decoder.LayerPrefix(1) + decoder.QProj + ".bias")
	if !slices.Equal(qb, permute(hf, cfg.NumAttentionHeads, 1, false)) || slices.Equal(qb, hf) {
		t.Fatalf("attn_q.bias is not the permuted q_proj bias")
	}
	m, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Config.AttentionBias || !m.Config.MLPBias || len(m.Params) != len(params) {
		t.Fatalf("biases: attention %v mlp %v, %d tensors of %d", m.Config.AttentionBias, m.Config.MLPBias, len(m.Params), len(params))
	}
	for _, name := range params.Names() {
		a, _ := params.Float32s(name)
		b, _ := m.Params.Float32s(name)
		if !slices.Equal(a, b) {
			t.Fatalf("%s differs after the round trip", name)
		}
	}
}
