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

// Rope scaling kinds (rope_scaling's rope_type) memfit implements. transformers also knows "dynamic" and "yarn":
// a config with one of them is refused by name. "default" is plain RoPE (RopeScaling nil).
const (
	// RopeLinear divides every rotary frequency by Factor (position interpolation).
	RopeLinear = "linear"
	// RopeLlama3 is Llama 3.1's scaling: low frequencies divided by Factor, high ones kept, the band between
	// interpolated.
	RopeLlama3 = "llama3"
	// RopeLongRope is Phi-3's (LongRoPE, Phi-3-128k, Phi-3.5, Phi-4-mini): each frequency divided by its own
	// factor, ShortFactor for sequences up to OriginalMaxPositionEmbeddings and LongFactor beyond, and cos and
	// sin multiplied by AttentionFactor.
	RopeLongRope = "longrope"
)

// RopeTypes are the rope_type values memfit accepts, in the order its messages list them.
var RopeTypes = []string{"default", RopeLinear, RopeLlama3, RopeLongRope}

// ropeTypeList is RopeTypes as a message lists them: "default, linear, llama3 and longrope".
func ropeTypeList() string {
	return strings.Join(RopeTypes[:len(RopeTypes)-1], ", ") + " and " + RopeTypes[len(RopeTypes)-1]
}

// RopeScaling is config.json's rope_scaling (or transformers 5's rope_parameters) of rope_type "linear", "llama3"
// or "longrope".
type RopeScaling struct {
	// Type is RopeLinear, RopeLlama3 or RopeLongRope ("" is read as RopeLlama3, what Go callers meant before Type
	// existed).
	Type string
	// Factor is linear's and llama3's factor (longrope's: max_position_embeddings over the original); the
	// others are llama3's.
	Factor, LowFreqFactor, HighFreqFactor float64
	// OriginalMaxPositionEmbeddings is llama3's and longrope's original context.
	OriginalMaxPositionEmbeddings int
	// ShortFactor and LongFactor are longrope's per-frequency divisors (rotary_dim / 2 each); AttentionFactor
	// multiplies its cos and sin (0: sqrt(1 + ln(factor) / ln(original)), 1 when factor <= 1, as transformers
	// computes it).
	ShortFactor, LongFactor []float64
	AttentionFactor         float64
}

// fields returns s as config.json's rope_scaling object.
func (s *RopeScaling) fields() map[string]any {
	switch s.kind() {
	case RopeLinear:
		return map[string]any{"rope_type": RopeLinear, "factor": s.Factor}
	case RopeLongRope:
		f := map[string]any{"rope_type": RopeLongRope, "short_factor": s.ShortFactor, "long_factor": s.LongFactor}
		if s.AttentionFactor > 0 {
			f["attention_factor"] = s.AttentionFactor
		}
		return f
	}
	return map[string]any{"rope_type": RopeLlama3, "factor": s.Factor, "low_freq_factor": s.LowFreqFactor,
		"high_freq_factor": s.HighFreqFactor, "original_max_position_embeddings": s.OriginalMaxPositionEmbeddings}
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

	// The switches by which the families differ from LLaMA's graph (their zero values are LLaMA's).

	// QKVBias gives q, k and v biases but not o_proj (Qwen2; AttentionBias gives all four).
	QKVBias bool
	// QKNorm normalises each head of q and k with RMSNorm (self_attn.q_norm / k_norm, [head_dim]) before RoPE
	// (Qwen3, Gemma 3).
	QKNorm bool
	// NormPlusOne: every RMSNorm scales by 1 + weight (Gemma; the checkpoint stores weight around 0).
	NormPlusOne bool
	// EmbedScale multiplies the token embeddings by sqrt(hidden_size) before the first layer (Gemma; the tied
	// head reads the unscaled table).
	EmbedScale bool
	// SandwichNorms: the attention and MLP outputs are normalised before they join the residual stream
	// (post_attention_layernorm, post_feedforward_layernorm), and pre_feedforward_layernorm is the MLP's input
	// norm (Gemma 2 and 3).
	SandwichNorms bool
	// Activation is the gated MLP's activation: ActSiLU ("" too: SwiGLU) or ActGELUTanh (GeGLU with
	// gelu_pytorch_tanh, Gemma).
	Activation string
	// AttnSoftCap caps the attention scores as cap * tanh(s / cap) before the mask, FinalSoftCap the logits
	// (Gemma 2); 0: none.
	AttnSoftCap, FinalSoftCap float64
	// QueryPreAttnScalar scales the scores by its inverse square root instead of head_dim's (Gemma); 0: head_dim.
	QueryPreAttnScalar float64
	// SlidingWindow is how many keys a query of a sliding layer sees, its own included (sliding_window); Sliding
	// marks those layers (layer_types' "sliding_attention"; nil: none).
	SlidingWindow int
	Sliding       []bool
	// LocalRopeTheta is the rope base of the sliding layers, which take no rope scaling (Gemma 3's
	// rope_local_base_freq); 0: the sliding layers take the global rope.
	LocalRopeTheta float64
	// FusedQKV: q, k and v are one projection self_attn.qkv_proj (rows q, then k, then v); FusedGateUp: gate and
	// up are one mlp.gate_up_proj (gate rows first) (Phi-3).
	FusedQKV, FusedGateUp bool
	// PartialRotary is the share of each head's dimensions RoPE rotates, the first ones (Phi-3's
	// partial_rotary_factor); 0 or 1: all.
	PartialRotary float64
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
	if d.IsNull("head_dim") { // null means hidden_size / heads (Mistral's configs write it so)
		c.HeadDim = 0
	}
	d.Get("head_dim", &c.HeadDim)
	d.Get("max_position_embeddings", &c.MaxPositionEmbeddings)
	d.Get("rms_norm_eps", &c.RMSNormEps)
	d.Get("rope_theta", &c.RopeTheta)
	d.Get("tie_word_embeddings", &c.TieWordEmbeddings)
	// null is none (-1), not the family's default.
	for _, f := range []struct {
		name string
		id   *int
	}{{"pad_token_id", &c.PadTokenID}, {"bos_token_id", &c.BOSTokenID}, {"eos_token_id", &c.EOSTokenID}} {
		if d.IsNull(f.name) {
			*f.id = -1
		}
	}
	if d.IsNull("eos_token_id") {
		c.EOSTokenIDs = nil
	}
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
		c.RopeScaling = decodeRopeScaling(d, "rope_scaling", "rope_scaling", raw).scaling
	}
	// transformers 5 writes rope_theta and the scaling together as rope_parameters (with partial_rotary_factor
	// where the config has one), or, for a model whose layer types take different ropes (Gemma 3), one such
	// object per layer type.
	if raw := d.Raw("rope_parameters"); raw != nil {
		if d.Has("rope_scaling") {
			d.Fail("fields \"rope_scaling\" and \"rope_parameters\" are both given: give one")
		}
		readRopeParameters(d, c, raw)
	}
	c.Labels = hfconfig.Labels(d)
	d.Ignore(hfconfig.CommonIgnored...)
	hfconfig.RefuseQuantized(d)
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
	if c.Activation == "" {
		c.Activation = ActSiLU
	}
	if c.PartialRotary == 1 {
		c.PartialRotary = 0 // the whole head, as 0 says
	}
	if d.IsNull("sliding_window") && slices.Contains(c.Sliding, true) {
		return fmt.Errorf("field \"sliding_window\" is null but the model has sliding_attention layers (layer_types, or the family's pattern): give the window")
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
	if s := c.RopeScaling; s != nil {
		fields["rope_scaling"] = s.fields()
	}
	for key, id := range map[string]int{"pad_token_id": c.PadTokenID, "bos_token_id": c.BOSTokenID} {
		if id >= 0 {
			fields[key] = id
		} else {
			fields[key] = nil // none, where a family's class would default to an id
		}
	}
	if eos := c.EOSIDs(); len(eos) == 0 {
		fields["eos_token_id"] = nil
	} else if len(eos) == 1 {
		fields["eos_token_id"] = eos[0]
	} else if len(eos) > 1 {
		fields["eos_token_id"] = eos // a list, as the config gave it
	}
	if len(c.Labels) > 0 {
		fields["id2label"], fields["label2id"] = hfconfig.LabelFields(c.Labels)
	}
	return fields
}

// ropeParams is one rope_scaling or rope_parameters object: the scaling (nil for plain RoPE), and
// rope_parameters' rope_theta and partial_rotary_factor when it holds them.
type ropeParams struct {
	scaling              *RopeScaling
	theta, partial       float64
	hasTheta, hasPartial bool
}

// layerTypes are the layer types transformers 5 keys a per-layer-type rope_parameters by.
var layerTypes = []string{"full_attention", "sliding_attention"}

// readRopeParameters reads transformers 5's rope_parameters into c: one object (the rope of every layer), or one
// per layer type ({"full_attention": {...}, "sliding_attention": {...}}, as Gemma3TextConfig writes it): the full
// layers' rope is the model's rope (rope_theta and its scaling), the sliding layers' rope_theta their own base
// (LocalRopeTheta; memfit's sliding layers take no scaling). rope_theta and partial_rotary_factor given both at the
// top level and inside must agree.
func readRopeParameters(d *hfconfig.Decoder, c *Config, raw json.RawMessage) {
	var byType map[string]json.RawMessage
	nested := json.Unmarshal(raw, &byType) == nil && len(byType) > 0
	for key := range byType {
		nested = nested && slices.Contains(layerTypes, key)
	}
	full := raw
	if nested {
		full = byType["full_attention"]
		if sliding := byType["sliding_attention"]; sliding != nil {
			p := decodeRopeScaling(d, "rope_parameters", "rope_parameters for sliding_attention", sliding)
			if p.scaling != nil {
				d.Fail("field \"rope_parameters\" for sliding_attention: rope_type %q is not supported: memfit's sliding layers take plain RoPE (a rope_theta of their own)", p.scaling.kind())
			}
			if p.hasTheta {
				c.LocalRopeTheta = p.theta
			}
			if p.hasPartial {
				c.PartialRotary = p.partial
			}
		}
		if full == nil {
			return
		}
	}
	label := "rope_parameters"
	if nested {
		label = "rope_parameters for full_attention"
	}
	p := decodeRopeScaling(d, "rope_parameters", label, full)
	c.RopeScaling = p.scaling
	if p.hasTheta {
		var top float64
		if d.Get("rope_theta", &top) && top != p.theta {
			d.Fail("field \"rope_theta\" is %g but rope_parameters' rope_theta is %g", top, p.theta)
		}
		c.RopeTheta = p.theta
	}
	if p.hasPartial {
		var top float64
		if d.Get("partial_rotary_factor", &top) && top != p.partial {
			d.Fail("field \"partial_rotary_factor\" is %g but rope_parameters' partial_rotary_factor is %g", top, p.partial)
		}
		c.PartialRotary = p.partial
	}
}

// decodeRopeScaling reads rope_scaling (or rope_parameters, whose rope_theta and partial_rotary_factor it returns
// too) as transformers does: an object whose rope_type (or legacy type) is "default", "linear", "llama3" or
// "longrope" (or "su"), with that kind's keys. The kinds memfit does not implement ("dynamic", "yarn", ...) and
// anything that is not such an object are the Decoder's error, in one line naming the field (label: how the
// messages name it).
func decodeRopeScaling(d *hfconfig.Decoder, field, label string, raw json.RawMessage) (out ropeParams) {
	var rs map[string]json.RawMessage
	if err := json.Unmarshal(raw, &rs); err != nil || rs == nil {
		d.Fail("field %q is %s: want an object such as {\"rope_type\": \"llama3\", \"factor\": 8, ...}, or null", label, hfconfig.Excerpt(raw))
		return ropeParams{}
	}
	bad := false
	fail := func(format string, args ...any) {
		if !bad {
			d.Fail("field %q: "+format, append([]any{label}, args...)...)
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
		return ropeParams{}
	}
	switch {
	case kind == "" && legacy == "":
		fail("no rope_type: give one of %s", ropeTypeList())
		return ropeParams{}
	case kind == "":
		kind = legacy
	case legacy != "" && legacy != kind:
		fail("rope_type %q and type %q differ", kind, legacy)
		return ropeParams{}
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
		if _, out.hasTheta = rs["rope_theta"]; out.hasTheta {
			out.theta = num("rope_theta")
		}
		if v, ok := rs["partial_rotary_factor"]; ok {
			if json.Unmarshal(v, &out.partial) != nil {
				fail("%q is %s: want a number", "partial_rotary_factor", hfconfig.Excerpt(v))
			}
			out.hasPartial = true
		}
		keys = append(keys, "rope_theta", "partial_rotary_factor")
	}
	var s *RopeScaling
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
	case RopeLongRope, "su": // "su" is the name early Phi-3 configs use; transformers reads it as longrope
		list := func(key string) []float64 {
			v, ok := rs[key]
			var x []float64
			if !ok {
				fail("%q is missing (rope_type %q needs it)", key, kind)
			} else if json.Unmarshal(v, &x) != nil || len(x) == 0 {
				fail("%q is %s: want a list of numbers", key, hfconfig.Excerpt(v))
			}
			for _, f := range x {
				if !(f > 0) || math.IsInf(f, 0) {
					fail("%q holds %g: every factor must be positive", key, f)
					break
				}
			}
			return x
		}
		opt := func(key string) float64 {
			if _, ok := rs[key]; !ok || string(rs[key]) == "null" {
				return 0
			}
			return num(key)
		}
		s = &RopeScaling{Type: RopeLongRope, ShortFactor: list("short_factor"), LongFactor: list("long_factor"),
			Factor: opt("factor"), AttentionFactor: opt("attention_factor"), OriginalMaxPositionEmbeddings: int(opt("original_max_position_embeddings"))}
		keys = append(keys, "short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings")
		if !bad && len(s.ShortFactor) != len(s.LongFactor) {
			fail("short_factor has %d factors and long_factor %d: they go together", len(s.ShortFactor), len(s.LongFactor))
		}
	default:
		if !bad {
			d.Fail("%s type %q is not supported by memfit: supported are %s", label, kind, ropeTypeList())
		}
		return ropeParams{}
	}
	for _, key := range slices.Sorted(maps.Keys(rs)) {
		if !slices.Contains(keys, key) {
			fail("option %q is not supported with rope_type %q", key, kind)
		}
	}
	if bad {
		return ropeParams{}
	}
	out.scaling = s
	return out
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
			if !(s.Factor > 0) || math.IsInf(s.Factor, 0) {
				return fmt.Errorf("field \"rope_scaling\": factor must be positive, got %g", s.Factor)
			}
		case RopeLongRope:
			if half := c.RotaryDim() / 2; len(s.ShortFactor) != half || len(s.LongFactor) != half {
				return fmt.Errorf("field \"rope_scaling\": longrope needs %d short and long factors (rotary dimension / 2), got %d and %d",
					half, len(s.ShortFactor), len(s.LongFactor))
			}
			if s.OriginalMaxPositionEmbeddings <= 0 || !(s.Factor > 0) || math.IsInf(s.Factor, 0) || s.AttentionFactor < 0 {
				return fmt.Errorf("field \"rope_scaling\": longrope needs a positive original_max_position_embeddings and factor (got %d, %g)",
					s.OriginalMaxPositionEmbeddings, s.Factor)
			}
		default:
			return fmt.Errorf("rope_scaling type %q is not supported by memfit: supported are %s", s.Type, ropeTypeList())
		}
		if s.kind() == RopeLlama3 && (!(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || s.OriginalMaxPositionEmbeddings <= 0) {
			return fmt.Errorf("field \"rope_scaling\": llama3 needs 0 < low_freq_factor < high_freq_factor and a positive original_max_position_embeddings (got %g, %g, %d)",
				s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositionEmbeddings)
		}
	}
	if err := c.validateSwitches(); err != nil {
		return err
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

// validateSwitches checks the per-family switches: known activation, finite soft-caps and scalars, one
// sliding flag per layer and a window for them, a rotated share that leaves an even number of dimensions.
func (c Config) validateSwitches() error {
	switch c.Activation {
	case "", ActSiLU, ActGELUTanh:
	default:
		return fmt.Errorf("activation %q: the decoder's gated MLP takes %s or %s", c.Activation, ActSiLU, ActGELUTanh)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"attn_logit_softcapping", c.AttnSoftCap}, {"final_logit_softcapping", c.FinalSoftCap}, {"query_pre_attn_scalar", c.QueryPreAttnScalar},
		{"rope_local_base_freq", c.LocalRopeTheta}} {
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return fmt.Errorf("field %q must be positive (or absent), got %g", f.name, f.v)
		}
	}
	if c.Sliding != nil && len(c.Sliding) != c.NumHiddenLayers {
		return fmt.Errorf("field \"layer_types\" lists %d layers, the model has %d (num_hidden_layers)", len(c.Sliding), c.NumHiddenLayers)
	}
	if c.SlidingWindow < 0 || (c.SlidingWindow == 0 && slices.Contains(c.Sliding, true)) {
		return fmt.Errorf("field \"sliding_window\" is %d: sliding layers need a positive window", c.SlidingWindow)
	}
	if p := c.PartialRotary; p < 0 || p > 1 || math.IsNaN(p) {
		return fmt.Errorf("field \"partial_rotary_factor\" is %g: give a share of the head in (0, 1]", p)
	}
	if rd := c.RotaryDim(); rd < 2 || rd%2 != 0 {
		return fmt.Errorf("partial_rotary_factor %g rotates %d of the head's %d dimensions: rotary embeddings need an even, positive number", c.PartialRotary, rd, c.HeadDim)
	}
	return nil
}

// Activations of the gated MLP (Config.Activation, as config.json's hidden_act / hidden_activation names them).
const (
	ActSiLU     = "silu"
	ActGELUTanh = "gelu_pytorch_tanh"
)

// RotaryDim returns how many of each head's dimensions RoPE rotates (the first ones): head_dim times
// partial_rotary_factor, rounded down as transformers' int() does.
func (c Config) RotaryDim() int {
	if c.PartialRotary > 0 && c.PartialRotary < 1 {
		return int(float64(c.HeadDim) * c.PartialRotary)
	}
	return c.HeadDim
}

// IsSliding reports whether layer i attends within the sliding window.
func (c Config) IsSliding(i int) bool { return i < len(c.Sliding) && c.Sliding[i] }

// Rope is the rotary embedding of a kind of layer: the inverse frequencies (RotaryDim / 2) and the factor that
// multiplies cos and sin (transformers' attention_scaling; 1 but for longrope).
type Rope struct {
	InvFreq []float32
	Scale   float32
}

// InvFreq returns the rotary inverse frequencies of the full-attention layers for sequences within the original
// context (RotaryDim / 2 of them): RopeFor(false, 0).InvFreq.
func (c Config) InvFreq() []float32 { return c.RopeFor(false, 0).InvFreq }

// RopeFor returns the rotary embedding of a sliding (sliding: Gemma 3's local base, unscaled) or full-attention
// layer for a sequence whose largest position is length-1 (longrope takes its long factors past the original
// context, as transformers' dynamic update does), as transformers computes it in float32: 1 / theta^(2i/dim),
// then adjusted by the linear, llama3 or longrope scaling when configured.
func (c Config) RopeFor(sliding bool, length int) Rope {
	theta, s := c.RopeTheta, c.RopeScaling
	if sliding && c.LocalRopeTheta > 0 {
		theta, s = c.LocalRopeTheta, nil
	}
	dim := c.RotaryDim()
	out := make([]float32, dim/2)
	pow := make([]float32, dim/2)
	for i := range out {
		// torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every step rounded to float32.
		exp := float32(2*i) / float32(dim)
		pow[i] = float32(math.Pow(theta, float64(exp)))
		out[i] = 1 / pow[i]
	}
	r := Rope{InvFreq: out, Scale: 1}
	switch {
	case s == nil:
	case s.kind() == RopeLinear:
		// transformers' linear scaling: inv_freq / factor, in float32.
		for i := range out {
			out[i] /= float32(s.Factor)
		}
	case s.kind() == RopeLongRope:
		// inv_freq = 1 / (ext * base^(2i/dim)) in float32, ext the short or the long factors.
		ext := s.ShortFactor
		if length > s.OriginalMaxPositionEmbeddings {
			ext = s.LongFactor
		}
		for i := range out {
			out[i] = 1 / (float32(ext[i]) * pow[i])
		}
		r.Scale = float32(s.longRopeScale())
	default:
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
	return r
}

// longRopeScale is longrope's attention factor: AttentionFactor when given, else sqrt(1 + ln(factor) /
// ln(original)) when factor > 1, else 1 (transformers' _compute_longrope_parameters).
func (s *RopeScaling) longRopeScale() float64 {
	switch {
	case s.AttentionFactor > 0:
		return s.AttentionFactor
	case s.Factor <= 1:
		return 1
	}
	return math.Sqrt(1 + math.Log(s.Factor)/math.Log(float64(s.OriginalMaxPositionEmbeddings)))
}
