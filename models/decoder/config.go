// Package decoder is the decoder graph every decoder-only family runs on (LLaMA, and through their family
// packages Qwen, Mistral, Gemma, Phi): a causal LM or sequence classifier in the Hugging Face layout, its
// differences between families as switches of Config, built in any combination of the memory-saving options:
// approximate activation backward (ReSiLU2), memory-sharing RMSNorm (MS-RMSNorm), Mesa, per-block gradient
// checkpointing, and the attention kind. A family package (family/llama, ...) decodes its config.json into a
// Config (ReadCommon reads the fields they share) and registers the family with finetune; nothing here knows a
// model_type.
package decoder

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/hfconfig"
)

// Tasks a decoder is built for (PEFT's task_type names).
const (
	// CausalLM predicts the next token: logits [B, T, vocab].
	CausalLM = models.TaskCausalLM
	// SequenceClassification classifies each row from its last non-pad token: logits [B, labels].
	SequenceClassification = models.TaskSeqCls
)

// Rope scaling kinds (rope_scaling's rope_type) memfit implements. transformers also knows "dynamic", "yarn" and
// "longrope": a config with one of them is refused by name. "default" is plain RoPE (RopeScaling nil).
const (
	// RopeLinear divides every rotary frequency by Factor (position interpolation).
	RopeLinear = "linear"
	// RopeLlama3 is Llama 3.1's scaling: low frequencies divided by Factor, high ones kept, the band between
	// interpolated.
	RopeLlama3 = "llama3"
)

// RopeTypes are the rope_type values memfit accepts, in the order its messages list them.
var RopeTypes = []string{"default", RopeLinear, RopeLlama3}

// ropeTypeList is RopeTypes as a message lists them: "default, linear and llama3".
func ropeTypeList() string {
	return strings.Join(RopeTypes[:len(RopeTypes)-1], ", ") + " and " + RopeTypes[len(RopeTypes)-1]
}

// RopeScaling is config.json's rope_scaling (or transformers 5's rope_parameters) of rope_type "linear" or
// "llama3".
type RopeScaling struct {
	// Type is RopeLinear or RopeLlama3 ("" is read as RopeLlama3, what Go callers meant before Type existed).
	Type string
	// Factor is both kinds' factor; the others are llama3's.
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositionEmbeddings         int
}

// kind returns s's rope_type.
func (s *RopeScaling) kind() string {
	if s.Type == "" {
		return RopeLlama3
	}
	return s.Type
}

// Config is a decoder's configuration: the sizes and settings of transformers' LlamaConfig that every family
// shares, and the switches by which families differ from LLaMA's graph (all off for LLaMA).
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
	RopeScaling *RopeScaling
	// AttentionBias gives q/k/v and o their biases (LLaMA's attention_bias); MLPBias gives gate/up/down theirs.
	AttentionBias     bool
	MLPBias           bool
	TieWordEmbeddings bool
	// PadTokenID and BOSTokenID are -1 when absent (pad_token_id may also be -1 in config.json, as transformers
	// allows). EOSTokenID is the first end-of-sequence id (-1 when there is none), for callers that take one.
	PadTokenID, BOSTokenID, EOSTokenID int
	// EOSTokenIDs are all the end-of-sequence ids of eos_token_id, which transformers takes as one id or a list
	// (every Llama-3.x Instruct config lists several); generation stops at any of them (EOSIDs, which also takes
	// EOSTokenID of a Config built in Go with that field alone).
	EOSTokenIDs []int
	// Task is CausalLM or SequenceClassification.
	Task string
	// Labels are the class names of a sequence classifier.
	Labels []string
	// Unknown lists config fields memfit does not know; they are ignored (callers may warn).
	Unknown []string
}

// Classifier reports whether the model is a sequence classifier.
func (c Config) Classifier() bool { return c.Task == SequenceClassification }

// ReadCommon reads into c the config.json fields every decoder family shares (those of transformers'
// LlamaConfig, under the same names): the sizes (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads required), num_key_value_heads (default: the heads), head_dim, max_position_embeddings,
// rms_norm_eps, rope_theta and its scaling (rope_scaling, or transformers 5's rope_parameters), the token ids, the
// labels, tie_word_embeddings, attention_dropout (0 only), and marks the fields of PretrainedConfig that describe
// no network as known. c's fields that the config omits keep the values they have (the family's defaults). A
// family's decoder calls it, reads its own fields, then Finish.
func ReadCommon(d *hfconfig.Decoder, c *Config) {
	d.Require("vocab_size", &c.VocabSize)
	d.Require("hidden_size", &c.HiddenSize)
	d.Require("intermediate_size", &c.IntermediateSize)
	d.Require("num_hidden_layers", &c.NumHiddenLayers)
	d.Require("num_attention_heads", &c.NumAttentionHeads)
	if !d.Get("num_key_value_heads", &c.NumKeyValueHeads) {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if d.Has("head_dim") {
		// null means the default (hidden_size / heads), as Mistral's configs write it.
		var hd *int
		d.Get("head_dim", &hd)
		if hd != nil {
			c.HeadDim = *hd
		}
	}
	d.Get("max_position_embeddings", &c.MaxPositionEmbeddings)
	d.Get("rms_norm_eps", &c.RMSNormEps)
	d.Get("rope_theta", &c.RopeTheta)
	d.Get("tie_word_embeddings", &c.TieWordEmbeddings)
	if ids := d.TokenIDs("pad_token_id"); len(ids) > 1 {
		d.Fail("field \"pad_token_id\" lists %d ids: give one (only eos_token_id takes a list)", len(ids))
	} else if len(ids) == 1 {
		c.PadTokenID = ids[0]
	}
	if ids := d.TokenIDs("bos_token_id"); len(ids) > 1 {
		d.Fail("field \"bos_token_id\" lists %d ids: give one (only eos_token_id takes a list)", len(ids))
	} else if len(ids) == 1 {
		c.BOSTokenID = ids[0]
	}
	if ids := d.TokenIDs("eos_token_id"); len(ids) > 0 {
		c.EOSTokenID, c.EOSTokenIDs = ids[0], ids
	}
	var dropout float64
	if d.Get("attention_dropout", &dropout) && dropout != 0 {
		d.Fail("field \"attention_dropout\" is %g: dropout is not supported, set it to 0", dropout)
	}
	if raw := d.Raw("rope_scaling"); raw != nil {
		c.RopeScaling, _, _ = decodeRopeScaling(d, "rope_scaling", raw)
	}
	// transformers 5 writes rope_theta and the scaling together as rope_parameters.
	if raw := d.Raw("rope_parameters"); raw != nil {
		if d.Has("rope_scaling") {
			d.Fail("fields \"rope_scaling\" and \"rope_parameters\" are both given: give one")
		}
		s, theta, hasTheta := decodeRopeScaling(d, "rope_parameters", raw)
		c.RopeScaling = s
		if hasTheta {
			var top float64
			if d.Get("rope_theta", &top) && top != theta {
				d.Fail("field \"rope_theta\" is %g but rope_parameters' rope_theta is %g", top, theta)
			}
			c.RopeTheta = theta
		}
	}
	c.Labels = hfconfig.Labels(d)
	d.Ignore(hfconfig.CommonIgnored...)
}

// Finish completes a decoded config: the decoder's error first, then the task (CausalLM when unset), head_dim
// from hidden_size / heads when the config has none, the unknown fields, and Validate's checks.
func Finish(d *hfconfig.Decoder, c *Config) error {
	if err := d.Err(); err != nil {
		return err
	}
	if c.Task == "" {
		c.Task = CausalLM
	}
	if c.HeadDim == 0 && c.NumAttentionHeads > 0 {
		// Without head_dim it is hidden_size / num_attention_heads, which must divide (with one, the attention's
		// width may differ from hidden_size: transformers allows it).
		if c.HiddenSize%c.NumAttentionHeads != 0 {
			return fmt.Errorf("field \"hidden_size\" (%d) is not a multiple of \"num_attention_heads\" (%d), and no head_dim is given", c.HiddenSize, c.NumAttentionHeads)
		}
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	c.Unknown = d.Unknown()
	return c.Validate()
}

// CommonJSON returns the config.json fields of ReadCommon as transformers writes them (a family's writer adds
// its model_type, architectures and own fields).
func (c Config) CommonJSON() map[string]any {
	fields := map[string]any{
		"vocab_size":              c.VocabSize,
		"hidden_size":             c.HiddenSize,
		"intermediate_size":       c.IntermediateSize,
		"num_hidden_layers":       c.NumHiddenLayers,
		"num_attention_heads":     c.NumAttentionHeads,
		"num_key_value_heads":     c.NumKeyValueHeads,
		"head_dim":                c.HeadDim,
		"max_position_embeddings": c.MaxPositionEmbeddings,
		"rms_norm_eps":            c.RMSNormEps,
		"rope_theta":              c.RopeTheta,
		"rope_scaling":            nil,
		"attention_dropout":       0.0,
		"tie_word_embeddings":     c.TieWordEmbeddings,
		"initializer_range":       0.02,
		"use_cache":               true,
		"torch_dtype":             "float32",
	}
	if s := c.RopeScaling; s != nil && s.kind() == RopeLinear {
		fields["rope_scaling"] = map[string]any{"rope_type": RopeLinear, "factor": s.Factor}
	} else if s != nil {
		fields["rope_scaling"] = map[string]any{"rope_type": RopeLlama3, "factor": s.Factor, "low_freq_factor": s.LowFreqFactor,
			"high_freq_factor": s.HighFreqFactor, "original_max_position_embeddings": s.OriginalMaxPositionEmbeddings}
	}
	for key, id := range map[string]int{"pad_token_id": c.PadTokenID, "bos_token_id": c.BOSTokenID} {
		if id >= 0 {
			fields[key] = id
		}
	}
	if eos := c.EOSIDs(); len(eos) == 1 {
		fields["eos_token_id"] = eos[0]
	} else if len(eos) > 1 {
		fields["eos_token_id"] = eos // a list, as the config gave it
	}
	if len(c.Labels) > 0 {
		fields["id2label"], fields["label2id"] = hfconfig.LabelFields(c.Labels)
	}
	return fields
}

// decodeRopeScaling reads rope_scaling (or rope_parameters, whose rope_theta it returns too) as transformers
// does: an object whose rope_type (or legacy type) is "default", "linear" or "llama3", with that kind's keys. The
// kinds memfit does not implement ("dynamic", "yarn", "longrope", ...) and anything that is not such an object
// are the Decoder's error, in one line naming the field.
func decodeRopeScaling(d *hfconfig.Decoder, field string, raw json.RawMessage) (s *RopeScaling, theta float64, hasTheta bool) {
	var rs map[string]json.RawMessage
	if err := json.Unmarshal(raw, &rs); err != nil || rs == nil {
		d.Fail("field %q is %s: want an object such as {\"rope_type\": \"llama3\", \"factor\": 8, ...}, or null", field, hfconfig.Excerpt(raw))
		return nil, 0, false
	}
	bad := false
	fail := func(format string, args ...any) {
		if !bad {
			d.Fail("field %q: "+format, append([]any{field}, args...)...)
		}
		bad = true
	}
	str := func(key string) string {
		v, ok := rs[key]
		if !ok {
			return ""
		}
		var out string
		if json.Unmarshal(v, &out) != nil {
			fail("%q is %s: want a string (one of %s)", key, hfconfig.Excerpt(v), ropeTypeList())
		}
		return out
	}
	kind, legacy := str("rope_type"), str("type")
	if bad {
		return nil, 0, false
	}
	switch {
	case kind == "" && legacy == "":
		fail("no rope_type: give one of %s", ropeTypeList())
		return nil, 0, false
	case kind == "":
		kind = legacy
	case legacy != "" && legacy != kind:
		fail("rope_type %q and type %q differ", kind, legacy)
		return nil, 0, false
	}
	num := func(key string) float64 {
		v, ok := rs[key]
		var x float64
		if !ok {
			fail("%q is missing (rope_type %q needs it)", key, kind)
		} else if json.Unmarshal(v, &x) != nil {
			fail("%q is %s: want a number", key, hfconfig.Excerpt(v))
		} else if !(x > 0) {
			fail("%q is %g: it must be positive", key, x)
		}
		return x
	}
	keys := []string{"rope_type", "type"}
	if field == "rope_parameters" {
		if _, hasTheta = rs["rope_theta"]; hasTheta {
			theta = num("rope_theta")
		}
		keys = append(keys, "rope_theta")
	}
	switch kind {
	case "default":
	case RopeLinear:
		s = &RopeScaling{Type: RopeLinear, Factor: num("factor")}
		keys = append(keys, "factor")
	case RopeLlama3:
		s = &RopeScaling{Type: RopeLlama3, Factor: num("factor"), LowFreqFactor: num("low_freq_factor"),
			HighFreqFactor: num("high_freq_factor"), OriginalMaxPositionEmbeddings: int(num("original_max_position_embeddings"))}
		keys = append(keys, "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
		if !bad && s.HighFreqFactor <= s.LowFreqFactor {
			fail("high_freq_factor (%g) must be more than low_freq_factor (%g)", s.HighFreqFactor, s.LowFreqFactor)
		}
	default:
		if !bad {
			d.Fail("%s type %q is not supported by memfit: supported are %s", field, kind, ropeTypeList())
		}
		return nil, 0, false
	}
	for _, key := range slices.Sorted(maps.Keys(rs)) {
		if !slices.Contains(keys, key) {
			fail("option %q is not supported with rope_type %q", key, kind)
		}
	}
	if bad {
		return nil, 0, false
	}
	return s, theta, hasTheta
}

// EOSIDs returns every end-of-sequence id: EOSTokenIDs, and EOSTokenID when it is set and not among them.
func (c Config) EOSIDs() []int {
	out := slices.Clone(c.EOSTokenIDs)
	if c.EOSTokenID >= 0 && !slices.Contains(out, c.EOSTokenID) {
		out = append([]int{c.EOSTokenID}, out...)
	}
	return out
}

// Validate checks the sizes against memfit's bounds, the head counts against each other and the hidden size,
// the token ids against the vocabulary and the rope settings; an error names the field and its value.
func (c Config) Validate() error {
	if err := hfconfig.CheckSizes(hfconfig.Size{Name: "vocab_size", Value: c.VocabSize, Max: 1 << 24},
		hfconfig.Size{Name: "hidden_size", Value: c.HiddenSize, Max: 1 << 16},
		hfconfig.Size{Name: "intermediate_size", Value: c.IntermediateSize, Max: 1 << 18},
		hfconfig.Size{Name: "num_hidden_layers", Value: c.NumHiddenLayers, Max: 4096},
		hfconfig.Size{Name: "num_attention_heads", Value: c.NumAttentionHeads, Max: 4096},
		hfconfig.Size{Name: "num_key_value_heads", Value: c.NumKeyValueHeads, Max: 4096},
		hfconfig.Size{Name: "head_dim", Value: c.HeadDim, Max: 4096},
		hfconfig.Size{Name: "max_position_embeddings", Value: c.MaxPositionEmbeddings, Max: 1 << 24},
		hfconfig.Size{Name: "num_labels", Value: max(len(c.Labels), 1), Max: hfconfig.MaxLabels}); err != nil {
		return err
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("field \"num_attention_heads\" (%d) is not a multiple of \"num_key_value_heads\" (%d)", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("field \"head_dim\" (%d) must be even for rotary embeddings", c.HeadDim)
	}
	if !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) {
		return fmt.Errorf("field \"rms_norm_eps\" must be positive, got %g", c.RMSNormEps)
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		return fmt.Errorf("field \"rope_theta\" must be positive, got %g", c.RopeTheta)
	}
	if s := c.RopeScaling; s != nil {
		switch s.kind() {
		case RopeLinear, RopeLlama3:
		default:
			return fmt.Errorf("rope_scaling type %q is not supported by memfit: supported are %s", s.Type, ropeTypeList())
		}
		if !(s.Factor > 0) || math.IsInf(s.Factor, 0) {
			return fmt.Errorf("field \"rope_scaling\": factor must be positive, got %g", s.Factor)
		}
		if s.kind() == RopeLlama3 && (!(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || s.OriginalMaxPositionEmbeddings <= 0) {
			return fmt.Errorf("field \"rope_scaling\": llama3 needs 0 < low_freq_factor < high_freq_factor and a positive original_max_position_embeddings (got %g, %g, %d)",
				s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositionEmbeddings)
		}
	}
	vocab := fmt.Sprintf("the vocabulary [0, %d) (vocab_size)", c.VocabSize)
	if c.PadTokenID < -1 || c.PadTokenID >= c.VocabSize {
		return fmt.Errorf("field \"pad_token_id\" is %d, outside %s: give an id inside it, or -1 or null for none", c.PadTokenID, vocab)
	}
	if c.BOSTokenID < -1 || c.BOSTokenID >= c.VocabSize {
		return fmt.Errorf("field \"bos_token_id\" is %d, outside %s", c.BOSTokenID, vocab)
	}
	for _, id := range c.EOSTokenIDs {
		if id < 0 || id >= c.VocabSize {
			return fmt.Errorf("field \"eos_token_id\" holds %d, outside %s", id, vocab)
		}
	}
	if c.EOSTokenID < -1 || c.EOSTokenID >= c.VocabSize {
		return fmt.Errorf("field \"eos_token_id\" is %d, outside %s", c.EOSTokenID, vocab)
	}
	switch c.Task {
	case CausalLM:
	case SequenceClassification:
		if len(c.Labels) == 0 {
			return fmt.Errorf("the model is a sequence classifier (its \"architectures\") but the config has no labels (id2label or num_labels)")
		}
		if c.PadTokenID < 0 {
			return fmt.Errorf("field \"pad_token_id\" is needed by a sequence classifier (it finds each row's last token)")
		}
	default:
		return fmt.Errorf("task %q: a decoder is a %s or a %s", c.Task, CausalLM, SequenceClassification)
	}
	return nil
}

// InvFreq returns the rotary inverse frequencies (head_dim/2 of them), as transformers computes them in float32:
// 1 / theta^(2i/head_dim), then adjusted by the linear or llama3 scaling when configured.
func (c Config) InvFreq() []float32 {
	half := c.HeadDim / 2
	out := make([]float32, half)
	for i := range out {
		// torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step rounded to float32.
		exp := float32(2*i) / float32(c.HeadDim)
		p := float32(math.Pow(c.RopeTheta, float64(exp)))
		out[i] = 1 / p
	}
	if s := c.RopeScaling; s != nil && s.kind() == RopeLinear {
		// transformers' linear scaling: inv_freq / factor, in float32.
		for i := range out {
			out[i] /= float32(s.Factor)
		}
	} else if s != nil {
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
