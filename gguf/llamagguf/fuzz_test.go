package llamagguf

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// tinyFile writes a 1-layer LLaMA of 16 tokens as GGUF (with a SentencePiece and a byte-level vocabulary) for
// the fuzz seeds.
func tinyFile(t testing.TB, typ gguf.TensorType, vocab *tokenizer.GGUFVocab) []byte {
	t.Helper()
	cfg := decoder.Config{VocabSize: 16, HiddenSize: 32, IntermediateSize: 64, NumHiddenLayers: 1, NumAttentionHeads: 2, NumKeyValueHeads: 1,
		HeadDim: 16, MaxPositionEmbeddings: 32, RMSNormEps: 1e-5, RopeTheta: 10000, PadTokenID: -1, BOSTokenID: 1, EOSTokenID: 2,
		Task: decoder.CausalLM, RopeScaling: &decoder.RopeScaling{Type: decoder.RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8}}
	p := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := Write(p, cfg, decoder.RandomParams(cfg, 1), Options{Type: typ, Vocab: vocab}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tinyArchFile writes a 2-layer model of architecture a as f32 GGUF: Gemma 3 with a sliding pattern, q/k norms,
// a final soft-cap and a rescaled query; Phi-3 with fused projections, partial rotary and LongRoPE.
func tinyArchFile(t testing.TB, a string) []byte {
	t.Helper()
	cfg := decoder.Config{VocabSize: 16, HiddenSize: 32, IntermediateSize: 64, NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1,
		HeadDim: 16, MaxPositionEmbeddings: 64, RMSNormEps: 1e-6, RopeTheta: 10000, PadTokenID: 0, BOSTokenID: 1, EOSTokenID: 2,
		Task: decoder.CausalLM}
	archs[a].setSwitches(&cfg)
	switch a {
	case "gemma3":
		cfg.LocalRopeTheta, cfg.SlidingWindow, cfg.Sliding, cfg.FinalSoftCap, cfg.QueryPreAttnScalar = 1000, 4, []bool{true, false}, 5, 12
	case "phi3":
		cfg.PartialRotary = 0.5
		cfg.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLongRope, ShortFactor: []float64{1, 2, 3, 4}, LongFactor: []float64{2, 4, 6, 8},
			Factor: 4, OriginalMaxPositionEmbeddings: 16}
	}
	p := filepath.Join(t.TempDir(), a+".gguf")
	if err := Write(p, cfg, decoder.RandomParams(cfg, 2), Options{Type: gguf.F32, Arch: a}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzRead: any bytes read as a LLaMA GGUF (header, hyperparameters, tensors, tokenizer) give a model or an
// error, never a panic.
func FuzzRead(f *testing.F) {
	bpe := &tokenizer.GGUFVocab{Model: tokenizer.GGUFByteLevelBPE, Pre: "llama-bpe", BOS: 1, EOS: 2, UNK: -1, Pad: -1, AddBOS: true,
		Tokens: []string{"a", "b", "ab", "Ġ", "Ġa", "c", "d", "e", "f", "g", "h", "i", "j", "k", "<|s|>", "<|e|>"},
		Types:  []int32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3}, Merges: []string{"a b", "Ġ a"}}
	f.Add(tinyFile(f, gguf.Q8_0, nil))
	f.Add(tinyFile(f, gguf.F16, bpe))
	for _, a := range []string{"gemma3", "phi3"} {
		f.Add(tinyArchFile(f, a))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := gguf.Parse(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		if m, err := read(g); err == nil && m.Tokenizer != nil {
			m.Tokenizer.Encode("ab a", true)
		}
	})
}
