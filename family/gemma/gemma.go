// Package gemma is the Gemma families on the shared decoder graph: Gemma 2 (model_type "gemma2") and Gemma 3's
// text model (model_type "gemma3_text"): RMSNorm scaling by 1 + weight, embeddings scaled by sqrt(hidden_size),
// a GeGLU MLP with the tanh GELU, norms before and after attention and MLP, scores scaled by
// query_pre_attn_scalar, sliding-window layers alternating with full ones; Gemma 2 soft-caps the attention scores
// and the logits, Gemma 3 normalises q and k per head and gives its sliding layers their own RoPE base. Both are
// registered with finetune through family/lm from this package's init.
package gemma

import (
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/hfconfig"
)

// Gemma2 and Gemma3 are the families.
var (
	Gemma2 = &lm.Spec{Name: "gemma2", Title: "Gemma 2", Decode: decode, JSON: writeJSON, Presets: Gemma2Presets, GGUFArch: "gemma2",
		CausalLM: "Gemma2ForCausalLM", Classifier: "Gemma2ForSequenceClassification"}
	Gemma3 = &lm.Spec{Name: "gemma3_text", Title: "Gemma 3", Decode: decode, JSON: writeJSON, Presets: Gemma3Presets, GGUFArch: "gemma3",
		CausalLM: "Gemma3ForCausalLM", Classifier: "Gemma3ForSequenceClassification"}
)

func init() { lm.Register(Gemma2, Gemma3) }

// activations are the MLP activations a Gemma config may name: the tanh GELU (gelu_new is the same function).
var activations = map[string]string{"gelu_pytorch_tanh": decoder.ActGELUTanh, "gelu_new": decoder.ActGELUTanh}

// decode reads a Gemma2Config or Gemma3TextConfig as transformers does (its defaults where config.json is
// silent). Layer types: layer_types when given, else Gemma 2's alternation (even layers sliding) or Gemma 3's
// pattern (every sliding_window_pattern-th layer full). Gemma 3 ignores attn_logit_softcapping, as transformers
// does.
func decode(s *lm.Spec, f hfconfig.Fields) (decoder.Config, error) {
	d := hfconfig.NewDecoder(f)
	if err := hfconfig.ModelType(d, s.Name); err != nil {
		return decoder.Config{}, err
	}
	g3 := s.Name == "gemma3_text"
	c := decoder.Config{VocabSize: 256000, RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 8192, HeadDim: 256,
		PadTokenID: 0, BOSTokenID: 2, EOSTokenID: 1, EOSTokenIDs: []int{1}, TieWordEmbeddings: true,
		NormPlusOne: true, EmbedScale: true, SandwichNorms: true, Activation: decoder.ActGELUTanh,
		QueryPreAttnScalar: 256, SlidingWindow: 4096, AttnSoftCap: 50, FinalSoftCap: 30}
	if g3 {
		c.RopeTheta, c.MaxPositionEmbeddings, c.LocalRopeTheta, c.QKNorm = 1e6, 131072, 10000, true
		c.AttnSoftCap, c.FinalSoftCap = 0, 0
	}
	decoder.ReadCommon(d, &c)
	// Gemma2Config and Gemma3TextConfig read hidden_activation only: a hidden_act beside it (Gemma 1's name, which
	// some configs carry along) is ignored, as transformers ignores it.
	lm.Activation(d, &c, activations, "hidden_activation")
	d.Ignore("hidden_act")
	d.Get("attention_bias", &c.AttentionBias)
	d.Get("query_pre_attn_scalar", &c.QueryPreAttnScalar)
	attnCap := lm.Nullable(d, "attn_logit_softcapping", c.AttnSoftCap)
	if !g3 {
		c.AttnSoftCap = attnCap
	}
	c.FinalSoftCap = lm.Nullable(d, "final_logit_softcapping", c.FinalSoftCap)
	c.SlidingWindow = lm.Nullable(d, "sliding_window", c.SlidingWindow)
	pattern := 6 // Gemma3TextConfig's sliding_window_pattern
	if !d.Get("_sliding_window_pattern", &pattern) {
		d.Get("sliding_window_pattern", &pattern)
	}
	if g3 {
		d.Get("rope_local_base_freq", &c.LocalRopeTheta)
		var bidirectional bool
		if d.Get("use_bidirectional_attention", &bidirectional) && bidirectional {
			d.Fail("field \"use_bidirectional_attention\" is true: memfit builds Gemma 3 as a causal LM")
		}
	}
	d.Ignore("cache_implementation")
	if !lm.LayerTypes(d, &c) {
		c.Sliding = make([]bool, c.NumHiddenLayers)
		for i := range c.Sliding {
			if g3 {
				c.Sliding[i] = pattern > 0 && (i+1)%pattern != 0
			} else {
				c.Sliding[i] = (i+1)%2 != 0
			}
		}
	}
	s.ReadHead(d, &c)
	return c, decoder.Finish(d, &c)
}

// writeJSON writes c as s's config.json.
func writeJSON(s *lm.Spec, c decoder.Config) ([]byte, error) {
	f := s.Fields(c)
	f["hidden_activation"] = "gelu_pytorch_tanh"
	f["attention_bias"] = c.AttentionBias
	f["query_pre_attn_scalar"] = c.QueryPreAttnScalar
	for k, v := range lm.SlidingFields(c) {
		f[k] = v
	}
	if c.SlidingWindow > 0 {
		f["sliding_window"] = c.SlidingWindow
	}
	softcap := func(v float64) any {
		if v > 0 {
			return v
		}
		return nil
	}
	f["final_logit_softcapping"] = softcap(c.FinalSoftCap)
	f["attn_logit_softcapping"] = softcap(c.AttnSoftCap)
	if s.Name == "gemma3_text" {
		f["rope_local_base_freq"] = c.LocalRopeTheta
	}
	return hfconfig.Marshal(f)
}

// Gemma2Presets are real Gemma 2 shapes (and the golden model's, "tiny").
var Gemma2Presets = map[string]decoder.Config{
	"tiny": {VocabSize: 320, HiddenSize: 64, IntermediateSize: 128, NumHiddenLayers: 3, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		HeadDim: 16, MaxPositionEmbeddings: 128, RMSNormEps: 1e-6, RopeTheta: 10000, TieWordEmbeddings: true,
		NormPlusOne: true, EmbedScale: true, SandwichNorms: true, Activation: decoder.ActGELUTanh, QueryPreAttnScalar: 24,
		AttnSoftCap: 3, FinalSoftCap: 5, SlidingWindow: 6, Sliding: []bool{true, false, true}},
	// gemma-2-2b: google/gemma-2-2b.
	"gemma-2-2b": {VocabSize: 256000, HiddenSize: 2304, IntermediateSize: 9216, NumHiddenLayers: 26, NumAttentionHeads: 8,
		NumKeyValueHeads: 4, HeadDim: 256, MaxPositionEmbeddings: 8192, RMSNormEps: 1e-6, RopeTheta: 10000, TieWordEmbeddings: true,
		NormPlusOne: true, EmbedScale: true, SandwichNorms: true, Activation: decoder.ActGELUTanh, QueryPreAttnScalar: 256,
		AttnSoftCap: 50, FinalSoftCap: 30, SlidingWindow: 4096, Sliding: alternate(26, 2)},
}

// Gemma3Presets are real Gemma 3 text shapes (and the golden model's, "tiny").
var Gemma3Presets = map[string]decoder.Config{
	"tiny": {VocabSize: 320, HiddenSize: 64, IntermediateSize: 128, NumHiddenLayers: 3, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		HeadDim: 32, MaxPositionEmbeddings: 128, RMSNormEps: 1e-6, RopeTheta: 1e6, LocalRopeTheta: 10000, TieWordEmbeddings: true,
		NormPlusOne: true, EmbedScale: true, SandwichNorms: true, QKNorm: true, Activation: decoder.ActGELUTanh, QueryPreAttnScalar: 32,
		SlidingWindow: 6, Sliding: []bool{true, true, false}},
	// gemma-3-1b: google/gemma-3-1b-pt (text only, 512-token window, every sixth layer full).
	"gemma-3-1b": {VocabSize: 262144, HiddenSize: 1152, IntermediateSize: 6912, NumHiddenLayers: 26, NumAttentionHeads: 4,
		NumKeyValueHeads: 1, HeadDim: 256, MaxPositionEmbeddings: 32768, RMSNormEps: 1e-6, RopeTheta: 1e6, LocalRopeTheta: 10000,
		TieWordEmbeddings: true, NormPlusOne: true, EmbedScale: true, SandwichNorms: true, QKNorm: true, Activation: decoder.ActGELUTanh,
		QueryPreAttnScalar: 256, SlidingWindow: 512, Sliding: alternate(26, 6)},
}

// alternate returns layers sliding flags with every period-th layer full (layer i sliding when (i+1) % period != 0).
func alternate(layers, period int) []bool {
	out := make([]bool, layers)
	for i := range out {
		out[i] = (i+1)%period != 0
	}
	return out
}
