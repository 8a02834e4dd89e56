// Package mistral is the Mistral family (model_type "mistral") on the shared decoder graph: LLaMA's graph with a
// sliding window on every layer when sliding_window is set (Mistral-7B-v0.1: 4096; null from v0.2 on),
// registered with finetune through family/lm from this package's init.
package mistral

import (
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/hfconfig"
)

// Spec is the Mistral family. llama.cpp runs Mistral as its llama
// architecture, as its converter writes it.
var Spec = &lm.Spec{Name: "mistral", Decode: decode, JSON: writeJSON, Title: "Mistral", Presets: Presets, GGUFArch: "llama",
	CausalLM: "MistralForCausalLM", Classifier: "MistralForSequenceClassification"}

func init() { lm.Register(Spec) }

// decode reads a MistralConfig as transformers does: sliding_window 4096 when config.json has none, every layer
// windowed unless it is null (or layer_types says otherwise), head_dim null meaning hidden_size / heads.
func decode(s *lm.Spec, f hfconfig.Fields) (decoder.Config, error) {
	d := hfconfig.NewDecoder(f)
	if err := hfconfig.ModelType(d, s.Name); err != nil {
		return decoder.Config{}, err
	}
	c := decoder.Config{RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 4096 * 32, PadTokenID: -1, BOSTokenID: 1, EOSTokenID: 2,
		EOSTokenIDs: []int{2}, SlidingWindow: 4096}
	decoder.ReadCommon(d, &c)
	lm.Activation(d, &c, map[string]string{"silu": decoder.ActSiLU}, "hidden_act")
	c.SlidingWindow = lm.Nullable(d, "sliding_window", c.SlidingWindow)
	if !lm.LayerTypes(d, &c) && c.SlidingWindow > 0 {
		c.Sliding = make([]bool, c.NumHiddenLayers)
		for i := range c.Sliding {
			c.Sliding[i] = true
		}
	}
	s.ReadHead(d, &c)
	return c, decoder.Finish(d, &c)
}

// writeJSON writes c as a Mistral config.json.
func writeJSON(s *lm.Spec, c decoder.Config) ([]byte, error) {
	f := s.Fields(c)
	f["hidden_act"] = "silu"
	f["sliding_window"] = lm.SlidingFields(c)["sliding_window"]
	return hfconfig.Marshal(f)
}

// Presets are real Mistral shapes (and the golden model's, "tiny").
var Presets = map[string]decoder.Config{
	"tiny": {VocabSize: 320, HiddenSize: 64, IntermediateSize: 176, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		HeadDim: 16, MaxPositionEmbeddings: 128, RMSNormEps: 1e-5, RopeTheta: 10000},
	// mistral-7b: mistralai/Mistral-7B-v0.3 (32768-token vocabulary, no sliding window).
	"mistral-7b": {VocabSize: 32768, HiddenSize: 4096, IntermediateSize: 14336, NumHiddenLayers: 32, NumAttentionHeads: 32,
		NumKeyValueHeads: 8, HeadDim: 128, MaxPositionEmbeddings: 32768, RMSNormEps: 1e-5, RopeTheta: 1e6},
}
