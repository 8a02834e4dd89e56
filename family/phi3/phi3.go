// Package phi3 is the Phi-3 family (model_type "phi3": Phi-3, Phi-3.5 and Phi-4-mini) on the shared decoder graph:
// q, k and v as one qkv_proj, gate and up as one gate_up_proj, RoPE on a share of each head
// (partial_rotary_factor), longrope scaling with short and long factors, an optional sliding window on every
// layer; registered with finetune through family/lm from this package's init.
package phi3

import (
	"encoding/json"
	"maps"

	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/hfconfig"
)

// Spec is the Phi-3 family.
var Spec = &lm.Spec{Name: "phi3", Decode: decode, JSON: writeJSON, Title: "Phi-3", Presets: Presets, GGUFArch: "phi3",
	CausalLM: "Phi3ForCausalLM", Classifier: "Phi3ForSequenceClassification"}

func init() { lm.Register(Spec) }

// decode reads a Phi3Config as transformers does (its defaults where config.json is silent). Longrope's
// original context is original_max_position_embeddings (top-level, as Phi-3 configs give it; else inside
// rope_scaling / rope_parameters; else Phi3Config's default, 4096), its factor max_position_embeddings over that
// when the top-level field is given or none is (transformers' _compute_longrope_parameters reads the config
// attribute, which Phi3Config always has); rope_scaling types "su" and "yarn" (early Phi-3 configs) are longrope,
// as Phi3Config's _rope_scaling_adjustment makes them.
func decode(s *lm.Spec, f hfconfig.Fields) (decoder.Config, error) {
	d := hfconfig.NewDecoder(legacyYarn(f))
	if err := hfconfig.ModelType(d, s.Name); err != nil {
		return decoder.Config{}, err
	}
	c := decoder.Config{VocabSize: 32064, RMSNormEps: 1e-5, RopeTheta: 10000, MaxPositionEmbeddings: 4096, PadTokenID: 32000, BOSTokenID: 1,
		EOSTokenID: 32000, EOSTokenIDs: []int{32000}, FusedQKV: true, FusedGateUp: true}
	decoder.ReadCommon(d, &c)
	lm.Activation(d, &c, map[string]string{"silu": decoder.ActSiLU}, "hidden_act")
	lm.NoDropout(d, "resid_pdrop", "embd_pdrop")
	d.Get("partial_rotary_factor", &c.PartialRotary)
	original := 4096 // Phi3Config's default
	hasOriginal := d.Get("original_max_position_embeddings", &original)
	if c.SlidingWindow = lm.Nullable(d, "sliding_window", 0); c.SlidingWindow > 0 {
		c.Sliding = make([]bool, c.NumHiddenLayers)
		for i := range c.Sliding {
			c.Sliding[i] = true
		}
	}
	if s := c.RopeScaling; s != nil && s.Type == decoder.RopeLongRope {
		switch {
		case hasOriginal && original > 0:
			s.OriginalMaxPositionEmbeddings = original
			s.Factor = float64(c.MaxPositionEmbeddings) / float64(original)
		case s.OriginalMaxPositionEmbeddings == 0:
			s.OriginalMaxPositionEmbeddings = original
		}
		if s.Factor == 0 {
			s.Factor = float64(c.MaxPositionEmbeddings) / float64(s.OriginalMaxPositionEmbeddings)
		}
	}
	s.ReadHead(d, &c)
	return c, decoder.Finish(d, &c)
}

// legacyYarn returns f with a rope_scaling or rope_parameters whose type is "yarn" retyped "longrope": Phi3Config
// reads "yarn" (and "su") as longrope (its _rope_scaling_adjustment); f itself is left as it is.
func legacyYarn(f hfconfig.Fields) hfconfig.Fields {
	out := f
	for _, field := range []string{"rope_scaling", "rope_parameters"} {
		var rs map[string]json.RawMessage
		if json.Unmarshal(f[field], &rs) != nil || rs == nil {
			continue
		}
		changed := false
		for _, key := range []string{"type", "rope_type"} {
			var kind string
			if json.Unmarshal(rs[key], &kind) == nil && kind == "yarn" {
				rs[key], changed = json.RawMessage(`"longrope"`), true
			}
		}
		if !changed {
			continue
		}
		raw, err := json.Marshal(rs)
		if err != nil {
			continue
		}
		out = maps.Clone(out)
		out[field] = raw
	}
	return out
}

// writeJSON writes c as a Phi-3 config.json.
func writeJSON(s *lm.Spec, c decoder.Config) ([]byte, error) {
	f := s.Fields(c)
	f["hidden_act"] = "silu"
	f["resid_pdrop"], f["embd_pdrop"] = 0.0, 0.0
	f["partial_rotary_factor"] = 1.0
	if c.PartialRotary > 0 {
		f["partial_rotary_factor"] = c.PartialRotary
	}
	f["original_max_position_embeddings"] = c.MaxPositionEmbeddings
	if s := c.RopeScaling; s != nil && s.Type == decoder.RopeLongRope {
		f["original_max_position_embeddings"] = s.OriginalMaxPositionEmbeddings
	}
	f["sliding_window"] = lm.SlidingFields(c)["sliding_window"]
	return hfconfig.Marshal(f)
}

// Presets are real Phi-3 shapes (and the golden model's, "tiny").
var Presets = map[string]decoder.Config{
	"tiny": {VocabSize: 320, HiddenSize: 64, IntermediateSize: 128, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		HeadDim: 16, MaxPositionEmbeddings: 128, RMSNormEps: 1e-5, RopeTheta: 10000, TieWordEmbeddings: true, FusedQKV: true,
		FusedGateUp: true, PartialRotary: 0.75},
	// phi-3-mini: microsoft/Phi-3-mini-4k-instruct (a 2047-token sliding window on every layer).
	"phi-3-mini": {VocabSize: 32064, HiddenSize: 3072, IntermediateSize: 8192, NumHiddenLayers: 32, NumAttentionHeads: 32,
		NumKeyValueHeads: 32, HeadDim: 96, MaxPositionEmbeddings: 4096, RMSNormEps: 1e-5, RopeTheta: 10000, FusedQKV: true,
		FusedGateUp: true, SlidingWindow: 2047, Sliding: make32(true)},
}

// make32 returns 32 flags of v.
func make32(v bool) []bool {
	out := make([]bool, 32)
	for i := range out {
		out[i] = v
	}
	return out
}
