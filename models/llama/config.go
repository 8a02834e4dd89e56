// Package llama builds LLaMA-family models (LlamaForCausalLM, LlamaForSequenceClassification) in the Hugging
// Face layout, in any combination of the memory-saving options: approximate activation backward (ReSiLU2),
// memory-sharing RMSNorm (MS-RMSNorm) and the attention kind.
package llama

import (
	"fmt"
	"math"

	"github.com/memfit/memfit/models/hfconfig"
)

// Architecture names accepted in config.json's "architectures".
const (
	ArchCausalLM       = "LlamaForCausalLM"
	ArchClassification = "LlamaForSequenceClassification"
)

// RopeScaling is config.json's rope_scaling for rope_type "llama3" (the only scaling memfit supports).
type RopeScaling struct {
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositionEmbeddings         int
}

// Config is a Hugging Face LlamaConfig (model_type "llama").
type Config struct {
	VocabSize             int
	HiddenSize            int
	IntermediateSize      int
	NumHiddenLayers       int
	NumAttentionHeads     int
	NumKeyValueHeads      int
	HeadDim               int
	MaxPositionEmbeddings int
	RMSNormEps            float64
	RopeTheta             float64
	// RopeScaling is nil for plain RoPE.
	RopeScaling       *RopeScaling
	AttentionBias     bool
	MLPBias           bool
	TieWordEmbeddings bool
	// PadTokenID, BOSTokenID, EOSTokenID are -1 when absent.
	PadTokenID, BOSTokenID, EOSTokenID int
	// Labels are the class names for LlamaForSequenceClassification.
	Labels       []string
	Architecture string
	// Unknown lists config fields memfit does not know; they are ignored (callers may warn).
	Unknown []string
}

// ParseConfig decodes and validates a LLaMA config.json.
func ParseConfig(data []byte) (Config, error) { return hfconfig.ParseWith(data, decode) }

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (Config, error) { return hfconfig.LoadWith(dir, decode) }

func decode(f hfconfig.Fields) (Config, error) {
	d := hfconfig.NewDecoder(f)
	if err := hfconfig.ModelType(d, "llama"); err != nil {
		return Config{}, err
	}
	c := Config{RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 2048, PadTokenID: -1, BOSTokenID: -1, EOSTokenID: -1}
	d.Require("vocab_size", &c.VocabSize)
	d.Require("hidden_size", &c.HiddenSize)
	d.Require("intermediate_size", &c.IntermediateSize)
	d.Require("num_hidden_layers", &c.NumHiddenLayers)
	d.Require("num_attention_heads", &c.NumAttentionHeads)
	if !d.Get("num_key_value_heads", &c.NumKeyValueHeads) {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	d.Get("head_dim", &c.HeadDim)
	d.Get("max_position_embeddings", &c.MaxPositionEmbeddings)
	d.Get("rms_norm_eps", &c.RMSNormEps)
	d.Get("rope_theta", &c.RopeTheta)
	d.Get("attention_bias", &c.AttentionBias)
	d.Get("mlp_bias", &c.MLPBias)
	d.Get("tie_word_embeddings", &c.TieWordEmbeddings)
	d.Get("pad_token_id", &c.PadTokenID)
	d.Get("bos_token_id", &c.BOSTokenID)
	d.Get("eos_token_id", &c.EOSTokenID)
	var act string
	if d.Get("hidden_act", &act) && act != "silu" {
		d.Fail("field \"hidden_act\" is %q: memfit's LLaMA supports only \"silu\"", act)
	}
	var tp int
	if d.Get("pretraining_tp", &tp) && tp != 1 {
		d.Fail("field \"pretraining_tp\" is %d: only 1 is supported", tp)
	}
	var dropout float64
	if d.Get("attention_dropout", &dropout) && dropout != 0 {
		d.Fail("field \"attention_dropout\" is %g: dropout is not supported, set it to 0", dropout)
	}
	if d.Has("rope_scaling") {
		var rs map[string]any
		if d.Get("rope_scaling", &rs) {
			c.RopeScaling = decodeRopeScaling(d, rs)
		}
	} else {
		d.Ignore("rope_scaling")
	}
	c.Labels = hfconfig.Labels(d)
	c.Architecture = hfconfig.Architecture(d, ArchCausalLM, ArchClassification)
	d.Ignore(hfconfig.CommonIgnored...)
	if err := d.Err(); err != nil {
		return Config{}, err
	}
	if c.Architecture == "" {
		c.Architecture = ArchCausalLM
	}
	if c.HeadDim == 0 && c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	c.Unknown = d.Unknown()
	return c, c.Validate()
}

func decodeRopeScaling(d *hfconfig.Decoder, rs map[string]any) *RopeScaling {
	kind, _ := rs["rope_type"].(string)
	if kind == "" {
		kind, _ = rs["type"].(string)
	}
	if kind != "llama3" {
		d.Fail("field \"rope_scaling\": rope_type %q is not supported (memfit supports llama3 and none)", kind)
		return nil
	}
	num := func(key string) float64 {
		v, ok := rs[key].(float64)
		if !ok {
			d.Fail("field \"rope_scaling\": %q is missing or not a number", key)
		}
		return v
	}
	s := &RopeScaling{Factor: num("factor"), LowFreqFactor: num("low_freq_factor"), HighFreqFactor: num("high_freq_factor"),
		OriginalMaxPositionEmbeddings: int(num("original_max_position_embeddings"))}
	for key := range rs {
		switch key {
		case "rope_type", "type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings":
		default:
			d.Fail("field \"rope_scaling\": option %q is not supported", key)
		}
	}
	if s.Factor <= 0 || s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor || s.OriginalMaxPositionEmbeddings <= 0 {
		d.Fail("field \"rope_scaling\": factor, low_freq_factor < high_freq_factor and original_max_position_embeddings must be positive")
	}
	return s
}

// Validate checks the sizes.
func (c Config) Validate() error {
	if err := hfconfig.CheckSizes(hfconfig.Size{Name: "vocab_size", Value: c.VocabSize, Max: 1 << 24},
		hfconfig.Size{Name: "hidden_size", Value: c.HiddenSize, Max: 1 << 16},
		hfconfig.Size{Name: "intermediate_size", Value: c.IntermediateSize, Max: 1 << 18},
		hfconfig.Size{Name: "num_hidden_layers", Value: c.NumHiddenLayers, Max: 4096},
		hfconfig.Size{Name: "num_attention_heads", Value: c.NumAttentionHeads, Max: 4096},
		hfconfig.Size{Name: "num_key_value_heads", Value: c.NumKeyValueHeads, Max: 4096},
		hfconfig.Size{Name: "head_dim", Value: c.HeadDim, Max: 4096},
		hfconfig.Size{Name: "max_position_embeddings", Value: max(c.MaxPositionEmbeddings, 1), Max: 1 << 24},
		hfconfig.Size{Name: "num_labels", Value: max(len(c.Labels), 1), Max: hfconfig.MaxLabels}); err != nil {
		return err
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("field \"num_attention_heads\" (%d) is not a multiple of \"num_key_value_heads\" (%d)", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("field \"head_dim\" (%d) must be even for rotary embeddings", c.HeadDim)
	}
	if c.RMSNormEps <= 0 || c.RopeTheta <= 0 {
		return fmt.Errorf("fields \"rms_norm_eps\" and \"rope_theta\" must be positive")
	}
	if c.Architecture == ArchClassification {
		if len(c.Labels) == 0 {
			return fmt.Errorf("field \"architectures\" is %s but the config has no labels (id2label or num_labels)", ArchClassification)
		}
		if c.PadTokenID < 0 {
			return fmt.Errorf("field \"pad_token_id\" is needed by %s (it finds each row's last token)", ArchClassification)
		}
	}
	return nil
}

// JSON returns the config as config.json bytes, as transformers writes them.
func (c Config) JSON() ([]byte, error) {
	fields := map[string]any{
		"architectures":           []string{c.Architecture},
		"model_type":              "llama",
		"vocab_size":              c.VocabSize,
		"hidden_size":             c.HiddenSize,
		"intermediate_size":       c.IntermediateSize,
		"num_hidden_layers":       c.NumHiddenLayers,
		"num_attention_heads":     c.NumAttentionHeads,
		"num_key_value_heads":     c.NumKeyValueHeads,
		"head_dim":                c.HeadDim,
		"hidden_act":              "silu",
		"max_position_embeddings": c.MaxPositionEmbeddings,
		"rms_norm_eps":            c.RMSNormEps,
		"rope_theta":              c.RopeTheta,
		"rope_scaling":            nil,
		"attention_bias":          c.AttentionBias,
		"attention_dropout":       0.0,
		"mlp_bias":                c.MLPBias,
		"tie_word_embeddings":     c.TieWordEmbeddings,
		"pretraining_tp":          1,
		"initializer_range":       0.02,
		"use_cache":               true,
		"torch_dtype":             "float32",
	}
	if s := c.RopeScaling; s != nil {
		fields["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": s.Factor, "low_freq_factor": s.LowFreqFactor,
			"high_freq_factor": s.HighFreqFactor, "original_max_position_embeddings": s.OriginalMaxPositionEmbeddings}
	}
	for key, id := range map[string]int{"pad_token_id": c.PadTokenID, "bos_token_id": c.BOSTokenID, "eos_token_id": c.EOSTokenID} {
		if id >= 0 {
			fields[key] = id
		}
	}
	if len(c.Labels) > 0 {
		fields["id2label"], fields["label2id"] = hfconfig.LabelFields(c.Labels)
	}
	return hfconfig.Marshal(fields)
}

// Presets are named LLaMA shapes for `finetune init`.
var Presets = map[string]Config{
	// tiny: for tests (the shape of the golden llama_a model).
	"tiny": {VocabSize: 256, HiddenSize: 64, IntermediateSize: 172, NumHiddenLayers: 2, NumAttentionHeads: 4,
		NumKeyValueHeads: 2, HeadDim: 16, MaxPositionEmbeddings: 128, RMSNormEps: 1e-5, RopeTheta: 10000},
	// llama-1b: TinyLlama-1.1B shapes.
	"llama-1b": {VocabSize: 32000, HiddenSize: 2048, IntermediateSize: 5632, NumHiddenLayers: 22, NumAttentionHeads: 32,
		NumKeyValueHeads: 4, HeadDim: 64, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000},
	// llama-7b: LLaMA-2-7B shapes.
	"llama-7b": {VocabSize: 32000, HiddenSize: 4096, IntermediateSize: 11008, NumHiddenLayers: 32, NumAttentionHeads: 32,
		NumKeyValueHeads: 32, HeadDim: 128, MaxPositionEmbeddings: 4096, RMSNormEps: 1e-5, RopeTheta: 10000},
}

// Preset returns the named preset as a causal LM, or as a sequence classifier with numLabels generic labels
// (LABEL_i) when numLabels > 0 (pad token 0).
func Preset(name string, numLabels int) (Config, error) {
	c, err := hfconfig.Preset(Presets, "LLaMA", name)
	if err != nil {
		return Config{}, err
	}
	c.PadTokenID, c.BOSTokenID, c.EOSTokenID = -1, 1, 2
	c.Architecture = ArchCausalLM
	if numLabels > 0 {
		c.Architecture = ArchClassification
		c.PadTokenID = 0
		c.Labels = hfconfig.GenericLabels(numLabels)
	}
	return c, c.Validate()
}

// InvFreq returns the rotary inverse frequencies (head_dim/2 of them), as transformers computes them in float32:
// 1 / theta^(2i/head_dim), then adjusted by llama3 scaling when configured.
func (c Config) InvFreq() []float32 {
	half := c.HeadDim / 2
	out := make([]float32, half)
	for i := range out {
		// torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step rounded to float32.
		exp := float32(2*i) / float32(c.HeadDim)
		p := float32(math.Pow(c.RopeTheta, float64(exp)))
		out[i] = 1 / p
	}
	if s := c.RopeScaling; s != nil {
		lowWavelen := float64(s.OriginalMaxPositionEmbeddings) / s.LowFreqFactor
		highWavelen := float64(s.OriginalMaxPositionEmbeddings) / s.HighFreqFactor
		for i, f := range out {
			wavelen := 2 * math.Pi / float64(f)
			switch {
			case wavelen < highWavelen:
				// high frequency: unchanged
			case wavelen > lowWavelen:
				out[i] = float32(float64(f) / s.Factor)
			default:
				smooth := (float64(s.OriginalMaxPositionEmbeddings)/wavelen - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				out[i] = float32((1-smooth)*float64(f)/s.Factor + smooth*float64(f))
			}
		}
	}
	return out
}
