package llamagguf

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/memfit/memfit/models/decoder"
)

// arch is how llama.cpp builds one of its architectures (general.architecture), as the llama.cpp that
// node-llama-cpp 3.22.1 bundles does (src/models/<arch>.cpp, src/llama-model.cpp): the decoder switches its graph
// has, the tensors and settings it reads, and its own conventions where they differ from transformers'. Export
// checks a model against it (and refuses, naming the setting, what llama.cpp would run differently); import sets
// the switches it implies.
type arch struct {
	name string
	// The decoder switches of llama.cpp's graph: a model is exported under the architecture only with exactly
	// these (family/lm's Spec.GGUFArch names the architecture of a family, whose configs all have them).
	normPlusOne, embedScale, sandwich, qkNorm, fused bool
	act                                              string
	// permute: llama.cpp rotates (x[2i], x[2i+1]) pairs (LLAMA_ROPE_TYPE_NORM), so q and k rows are interleaved
	// from transformers' rotate-half layout; the other architectures rotate halves (NEOX) as transformers does.
	permute bool
	// The optional bias tensors llama.cpp loads: attn_q/k/v.bias (every architecture, through
	// create_tensor_qkv), attn_output.bias, ffn_{gate,up,down}.bias.
	oBias, mlpBias bool
	// hiddenQ: llama.cpp sizes q and o as hidden_size (qwen2, phi3): heads * head_dim must be it.
	hiddenQ bool
	// partialRotary: rope.dimension_count may be below head_dim (the llama architecture refuses that).
	partialRotary bool
	// llama3Rope: rope_freqs per-frequency factors (Llama 3.1 scaling); longRope: rope_factors_long/short
	// (Phi-3's LongRoPE). Linear scaling (rope.scaling.type/factor) every architecture reads.
	llama3Rope, longRope bool
	// swa: llama.cpp runs sliding-window layers (attention.sliding_window, sliding_window_pattern); without it a
	// window is written for memfit and ignored by llama.cpp. defaultPattern is llama.cpp's layer pattern when the
	// file has none (set_swa_pattern(n): layer i slides when i % n < n-1; 0: every layer, what memfit reads a
	// window without a pattern as in the architectures without one), defaultWindow its window.
	swa                           bool
	defaultPattern, defaultWindow int
	// swaAlways: llama.cpp runs the sliding pattern even when the file has no window (gemma2, defaulting it).
	swaAlways bool
	// localRope: sliding layers take attention rope.freq_base_swa, unscaled (gemma3).
	localRope bool
	// attnCap, finalCap: how llama.cpp soft-caps the attention scores and the logits: capNone (never), capAlways
	// (gemma2: with the file's value or its default), capOptional (gemma3's logits: when the file has a value).
	attnCap, finalCap       capMode
	attnCapDef, finalCapDef float64
	// tiedOnly: llama.cpp reads no output.weight (gemma2: the head is the embeddings).
	tiedOnly bool
	// fixedScale: llama.cpp scales the attention scores by its own rule, not query_pre_attn_scalar (gemma2,
	// gemma3: 1/sqrt(head_dim), or 1/sqrt(hidden_size / heads) for the 27B layer count bigLayers).
	fixedScale bool
	bigLayers  int
}

type capMode int

const (
	capNone capMode = iota
	capAlways
	capOptional
)

// archs are the architectures memfit writes and reads.
var archs = map[string]arch{
	"llama": {name: "llama", act: decoder.ActSiLU, permute: true, oBias: true, mlpBias: true, llama3Rope: true},
	"qwen2": {name: "qwen2", act: decoder.ActSiLU, hiddenQ: true},
	"qwen3": {name: "qwen3", act: decoder.ActSiLU, qkNorm: true},
	"gemma2": {name: "gemma2", act: decoder.ActGELUTanh, normPlusOne: true, embedScale: true, sandwich: true,
		swa: true, swaAlways: true, defaultPattern: 2, defaultWindow: 4096, attnCap: capAlways, attnCapDef: 50, finalCap: capAlways, finalCapDef: 30,
		tiedOnly: true, fixedScale: true, bigLayers: 46},
	"gemma3": {name: "gemma3", act: decoder.ActGELUTanh, normPlusOne: true, embedScale: true, sandwich: true, qkNorm: true,
		swa: true, defaultPattern: 6, localRope: true, finalCap: capOptional, fixedScale: true, bigLayers: 62},
	"phi3": {name: "phi3", act: decoder.ActSiLU, fused: true, hiddenQ: true, partialRotary: true, longRope: true},
}

// Archs returns the architecture names memfit writes and reads, sorted.
func Archs() []string {
	var out []string
	for n := range archs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func archOf(name string) (arch, error) {
	a, ok := archs[name]
	if !ok {
		return arch{}, fmt.Errorf("general.architecture is %q: memfit reads GGUF files of the architectures %s", name, strings.Join(Archs(), ", "))
	}
	return a, nil
}

// key returns the metadata key of the architecture's hyperparameter: "<arch>.<k>".
func (a arch) key(k string) string { return a.name + "." + k }

// setSwitches sets cfg's switches to the graph of a.
func (a arch) setSwitches(cfg *decoder.Config) {
	cfg.NormPlusOne, cfg.EmbedScale, cfg.SandwichNorms, cfg.QKNorm = a.normPlusOne, a.embedScale, a.sandwich, a.qkNorm
	cfg.FusedQKV, cfg.FusedGateUp, cfg.Activation = a.fused, a.fused, a.act
}

// check says why cfg's model cannot be exported as a.name (nil when it can): a graph other than llama.cpp's, or
// a setting llama.cpp's graph of a.name does not run. Each message is one line naming the setting.
func (a arch) check(cfg decoder.Config) error {
	want := cfg
	a.setSwitches(&want)
	act := cfg.Activation
	if act == "" {
		act = decoder.ActSiLU
	}
	if want.NormPlusOne != cfg.NormPlusOne || want.EmbedScale != cfg.EmbedScale || want.SandwichNorms != cfg.SandwichNorms ||
		want.QKNorm != cfg.QKNorm || want.FusedQKV != cfg.FusedQKV || want.FusedGateUp != cfg.FusedGateUp || act != a.act {
		return fmt.Errorf("the model's graph is not llama.cpp's %s (norms 1+w %v, scaled embeddings %v, sandwich norms %v, q/k norms %v, fused projections %v/%v, %s)",
			a.name, cfg.NormPlusOne, cfg.EmbedScale, cfg.SandwichNorms, cfg.QKNorm, cfg.FusedQKV, cfg.FusedGateUp, act)
	}
	no := func(what string) error {
		return fmt.Errorf("llama.cpp's %s architecture has no %s: this model cannot be exported as GGUF", a.name, what)
	}
	switch {
	case cfg.AttentionBias && !a.oBias:
		return no("o_proj bias (attention_bias)")
	case cfg.MLPBias && !a.mlpBias:
		return no("MLP biases (mlp_bias)")
	case a.hiddenQ && cfg.NumAttentionHeads*cfg.HeadDim != cfg.HiddenSize:
		return fmt.Errorf("llama.cpp's %s architecture needs heads * head_dim = hidden_size; this model has %d * %d and %d", a.name,
			cfg.NumAttentionHeads, cfg.HeadDim, cfg.HiddenSize)
	case !a.partialRotary && cfg.RotaryDim() != cfg.HeadDim:
		return no("partial rotary embeddings (partial_rotary_factor)")
	case cfg.AttnSoftCap > 0 && a.attnCap == capNone:
		return no("attention soft-capping (attn_logit_softcapping)")
	case cfg.FinalSoftCap > 0 && a.finalCap == capNone:
		return no("final logit soft-capping (final_logit_softcapping)")
	case !a.fixedScale && cfg.QueryPreAttnScalar > 0 && cfg.QueryPreAttnScalar != float64(cfg.HeadDim):
		return no("query_pre_attn_scalar")
	case cfg.LocalRopeTheta > 0 && !a.localRope:
		return no("separate RoPE base for sliding layers (rope_local_base_freq)")
	case a.tiedOnly && !cfg.TieWordEmbeddings:
		return fmt.Errorf("llama.cpp's %s architecture ties the output head to the embeddings: this model's untied head (tie_word_embeddings false) cannot be exported as GGUF", a.name)
	}
	if s := cfg.RopeScaling; s != nil {
		switch s.Type {
		case decoder.RopeLinear:
		case decoder.RopeLongRope:
			if !a.longRope {
				return no("LongRoPE scaling")
			}
		default:
			if !a.llama3Rope {
				return no("Llama-3.1 rope scaling")
			}
		}
		if a.localRope && cfg.LocalRopeTheta == 0 && slices.Contains(cfg.Sliding, true) {
			// llama.cpp's sliding layers are unscaled; memfit's take the global rope (scaled) without a local base.
			return no("scaled RoPE on sliding layers without rope_local_base_freq")
		}
	}
	return nil
}

// notes are what the user should know about how llama.cpp runs cfg's model exported as a.name.
func (a arch) notes(cfg decoder.Config) []string {
	if !a.swa && slices.Contains(cfg.Sliding, true) && cfg.SlidingWindow < cfg.MaxPositionEmbeddings {
		return []string{fmt.Sprintf("llama.cpp's %s architecture has no sliding window: it attends over the whole context where memfit (and transformers) "+
			"attend within the last %d tokens, so their outputs agree on sequences of up to %d tokens", a.name, cfg.SlidingWindow, cfg.SlidingWindow)}
	}
	return nil
}

// scoreScalar returns the number whose inverse square root llama.cpp scales a's attention scores by: head_dim,
// or for a fixedScale architecture its own rule (hidden_size / heads, integer division, at bigLayers layers).
func (a arch) scoreScalar(cfg decoder.Config) float64 {
	if a.fixedScale && cfg.NumHiddenLayers == a.bigLayers {
		return float64(cfg.HiddenSize / cfg.NumAttentionHeads)
	}
	return float64(cfg.HeadDim)
}

// queryScale is the factor export multiplies the queries by (through q_proj, or q_norm where the queries are
// normalised) so that llama.cpp's attention scale becomes the model's 1/sqrt(query_pre_attn_scalar): 1 when they
// agree.
func (a arch) queryScale(cfg decoder.Config) float32 {
	s := cfg.QueryPreAttnScalar
	if s <= 0 {
		s = float64(cfg.HeadDim)
	}
	if l := a.scoreScalar(cfg); l != s {
		return float32(math.Sqrt(l / s))
	}
	return 1
}
