// Package qwen is the Qwen families on the shared decoder graph: Qwen2 and Qwen2.5 (model_type "qwen2": q, k and
// v biases, tied or untied head, optional sliding-window layers) and Qwen3 (model_type "qwen3": q_norm and k_norm
// on each head before RoPE, head_dim of its own), registered with finetune through family/lm from this package's
// init.
package qwen

import (
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/hfconfig"
)

// Qwen2 is the Qwen2 / Qwen2.5 family; Qwen3 the Qwen3 family.
var (
	Qwen2 = &lm.Spec{Name: "qwen2", Title: "Qwen2", Decode: decode, JSON: writeJSON, Presets: Qwen2Presets, GGUFArch: "qwen2",
		CausalLM: "Qwen2ForCausalLM", Classifier: "Qwen2ForSequenceClassification"}
	Qwen3 = &lm.Spec{Name: "qwen3", Title: "Qwen3", Decode: decode, JSON: writeJSON, Presets: Qwen3Presets, GGUFArch: "qwen3",
		CausalLM: "Qwen3ForCausalLM", Classifier: "Qwen3ForSequenceClassification"}
)

func init() { lm.Register(Qwen2, Qwen3) }

// decode reads a Qwen2Config or Qwen3Config as transformers does (its defaults where config.json is silent).
// Sliding-window layers: layer_types when given (transformers 4.5x), else the layers from max_window_layers on
// when use_sliding_window; without use_sliding_window, sliding_window is ignored (transformers sets it to None),
// as every released Qwen2.5 and Qwen3 config has it.
func decode(s *lm.Spec, f hfconfig.Fields) (decoder.Config, error) {
	d := hfconfig.NewDecoder(f)
	if err := hfconfig.ModelType(d, s.Name); err != nil {
		return decoder.Config{}, err
	}
	qwen3 := s.Name == "qwen3"
	c := decoder.Config{RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 32768, PadTokenID: -1, BOSTokenID: -1, EOSTokenID: -1}
	if qwen3 {
		c.HeadDim = 128 // Qwen3Config's default
		c.QKNorm = true
	} else {
		c.QKVBias = true
	}
	decoder.ReadCommon(d, &c)
	if qwen3 {
		d.Get("attention_bias", &c.AttentionBias)
	}
	lm.Activation(d, &c, map[string]string{"silu": decoder.ActSiLU}, "hidden_act")
	useSliding, maxWindow := false, 28
	d.Get("use_sliding_window", &useSliding)
	window := lm.Nullable(d, "sliding_window", 4096)
	d.Get("max_window_layers", &maxWindow)
	if !lm.LayerTypes(d, &c) && useSliding {
		c.Sliding = make([]bool, c.NumHiddenLayers)
		for i := range c.Sliding {
			c.Sliding[i] = i >= maxWindow
		}
	}
	if useSliding && window > 0 {
		c.SlidingWindow = window
	} else {
		c.Sliding = nil
	}
	s.ReadHead(d, &c)
	return c, decoder.Finish(d, &c)
}

// writeJSON writes c as s's config.json.
func writeJSON(s *lm.Spec, c decoder.Config) ([]byte, error) {
	f := s.Fields(c)
	f["hidden_act"] = "silu"
	for k, v := range lm.SlidingFields(c) {
		f[k] = v
	}
	f["use_sliding_window"] = f["sliding_window"] != nil
	f["max_window_layers"] = c.NumHiddenLayers
	for i := range c.NumHiddenLayers {
		if c.IsSliding(i) {
			f["max_window_layers"] = i
			break
		}
	}
	if s.Name == "qwen3" {
		f["attention_bias"] = c.AttentionBias
	}
	return hfconfig.Marshal(f)
}

// Qwen2Presets are real Qwen2.5 shapes (and the golden model's, "tiny").
var Qwen2Presets = map[string]decoder.Config{
	"tiny": {VocabSize: 384, HiddenSize: 64, IntermediateSize: 160, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		HeadDim: 16, MaxPositionEmbeddings: 128, RMSNormEps: 1e-6, RopeTheta: 1e6, QKVBias: true, TieWordEmbeddings: true},
	// qwen2.5-0.5b: Qwen/Qwen2.5-0.5B (tied embeddings).
	"qwen2.5-0.5b": {VocabSize: 151936, HiddenSize: 896, IntermediateSize: 4864, NumHiddenLayers: 24, NumAttentionHeads: 14,
		NumKeyValueHeads: 2, HeadDim: 64, MaxPositionEmbeddings: 32768, RMSNormEps: 1e-6, RopeTheta: 1e6, QKVBias: true, TieWordEmbeddings: true},
	// qwen2.5-7b: Qwen/Qwen2.5-7B.
	"qwen2.5-7b": {VocabSize: 152064, HiddenSize: 3584, IntermediateSize: 18944, NumHiddenLayers: 28, NumAttentionHeads: 28,
		NumKeyValueHeads: 4, HeadDim: 128, MaxPositionEmbeddings: 131072, RMSNormEps: 1e-6, RopeTheta: 1e6, QKVBias: true},
}

// Qwen3Presets are real Qwen3 shapes (and the golden model's, "tiny").
var Qwen3Presets = map[string]decoder.Config{
	"tiny": {VocabSize: 352, HiddenSize: 64, IntermediateSize: 160, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		HeadDim: 32, MaxPositionEmbeddings: 128, RMSNormEps: 1e-6, RopeTheta: 1e6, QKNorm: true, TieWordEmbeddings: true},
	// qwen3-0.6b: Qwen/Qwen3-0.6B (tied embeddings, head_dim 128 over hidden 1024).
	"qwen3-0.6b": {VocabSize: 151936, HiddenSize: 1024, IntermediateSize: 3072, NumHiddenLayers: 28, NumAttentionHeads: 16,
		NumKeyValueHeads: 8, HeadDim: 128, MaxPositionEmbeddings: 40960, RMSNormEps: 1e-6, RopeTheta: 1e6, QKNorm: true, TieWordEmbeddings: true},
	// qwen3-8b: Qwen/Qwen3-8B.
	"qwen3-8b": {VocabSize: 151936, HiddenSize: 4096, IntermediateSize: 12288, NumHiddenLayers: 36, NumAttentionHeads: 32,
		NumKeyValueHeads: 8, HeadDim: 128, MaxPositionEmbeddings: 40960, RMSNormEps: 1e-6, RopeTheta: 1e6, QKNorm: true},
}
