// Package llamagguf converts a decoder-only causal LM (models/decoder: LLaMA, Mistral, Qwen2, Qwen3, Gemma 2,
// Gemma 3, Phi-3) between memfit's Hugging Face layout (decoder.Config, parameters by Hugging Face name, the
// tokenizer) and a GGUF file as llama.cpp's convert_hf_to_gguf.py writes it for the matching llama.cpp
// architecture (llama, qwen2, qwen3, gemma2, gemma3, phi3): llama.cpp's tensor names (token_embd,
// blk.N.attn_q, ...) and layouts (the llama architecture's q/k rows permuted from transformers' rotate-half
// rotary layout to its interleaved one; Gemma's norms stored as 1 + weight; Phi-3's fused attn_qkv and
// gate-then-up ffn_up), the <arch>.* hyperparameters, rope_freqs for Llama-3.1 rope scaling and
// rope_factors_long/short for Phi-3's LongRoPE, and the tokenizer.* vocabulary. Where llama.cpp's graph of an
// architecture departs from transformers' (Gemma's fixed attention scale, Gemma 2's soft-caps that are always
// on), the export adjusts the weights or values so that llama.cpp computes the model's function, and records
// what it changed under memfit.* keys. Read is Write's inverse, so memfit runs a GGUF it wrote (or llama.cpp's
// converter wrote, for the same features) as it runs the Hugging Face folder.
package llamagguf

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// Arch is the default general.architecture of the files this package writes: LLaMA's.
const Arch = "llama"

// Keys of memfit's own metadata: what llama.cpp does not keep but memfit needs to rebuild the config exactly
// (llama.cpp ignores them).
const (
	// Llama-3.1 rope scaling's settings: llama.cpp keeps only the rope_freqs factors they give.
	keyL3Factor   = "memfit.rope_scaling.llama3.factor"
	keyL3Low      = "memfit.rope_scaling.llama3.low_freq_factor"
	keyL3High     = "memfit.rope_scaling.llama3.high_freq_factor"
	keyL3Original = "memfit.rope_scaling.llama3.original_max_position_embeddings"
	// keyModelType is the config's model_type (the family): "mistral" for a Mistral written as llama.
	keyModelType = "memfit.model_type"
	// keyQueryScalar is query_pre_attn_scalar when it differs from llama.cpp's own attention scale, which the
	// export then folds into the queries' weights.
	keyQueryScalar = "memfit.query_pre_attn_scalar"
	// keyAttnCap and keyFinalCap are 0 when the model has no soft-cap where llama.cpp always applies one (Gemma
	// 2): the file then holds noCap.
	keyAttnCap  = "memfit.attn_logit_softcapping"
	keyFinalCap = "memfit.final_logit_softcapping"
	// keyPartialRotary is partial_rotary_factor as the config gives it (rope.dimension_count holds only the
	// rotated dimensions it gives).
	keyPartialRotary = "memfit.partial_rotary_factor"
)

// noCap is the soft-cap written where llama.cpp always caps but the model does not: c * tanh(x / c) differs from
// x by x³/(3c²), under float32's rounding for |x| < 400.
const noCap = 1e6

// ModelType returns the model_type a file memfit wrote records (memfit.model_type; "" when it has none).
func ModelType(f *gguf.File) string {
	s, _, _ := f.String(keyModelType)
	return s
}

// FileType returns general.file_type for tensors of type t (llama.cpp's LLAMA_FTYPE_ALL_F32, MOSTLY_F16,
// MOSTLY_Q8_0, MOSTLY_BF16).
func FileType(t gguf.TensorType) uint32 {
	switch t {
	case gguf.F16:
		return 1
	case gguf.Q8_0:
		return 7
	case gguf.BF16:
		return 32
	}
	return 0
}

// mapping pairs a GGUF tensor name with the Hugging Face parameter it holds, stored as (x + shift) * scale
// (Gemma's 1 + weight norms; queries rescaled to llama.cpp's attention scale; scale 0 is 1); heads > 0 marks a
// q/k projection (or its bias) of the llama architecture, whose rows are permuted, with the heads it holds.
type mapping struct {
	gguf, hf     string
	heads        int
	shift, scale float32
}

// mappings lists the tensors of cfg's model as architecture a stores them (those params has, for the optional
// ones: biases, the head).
func mappings(a arch, cfg decoder.Config, has func(string) bool) []mapping {
	var norm float32
	if a.normPlusOne {
		norm = 1
	}
	out := []mapping{{gguf: "token_embd.weight", hf: decoder.EmbedTokens}, {gguf: "output_norm.weight", hf: decoder.FinalNorm, shift: norm}}
	if !cfg.TieWordEmbeddings || has(decoder.LMHead) {
		out = append(out, mapping{gguf: "output.weight", hf: decoder.LMHead})
	}
	qScale := a.queryScale(cfg)
	heads := func(n int) int {
		if a.permute {
			return n
		}
		return 0
	}
	for i := range cfg.NumHiddenLayers {
		pre, blk := decoder.LayerPrefix(i), fmt.Sprintf("blk.%d.", i)
		add := func(g, h string, m mapping) {
			m.gguf, m.hf = blk+g, pre+h
			out = append(out, m)
		}
		add("attn_norm.weight", decoder.InputNorm, mapping{shift: norm})
		if cfg.SandwichNorms {
			add("post_attention_norm.weight", decoder.PostNorm, mapping{shift: norm})
			add("ffn_norm.weight", decoder.PreFFNorm, mapping{shift: norm})
			add("post_ffw_norm.weight", decoder.PostFFNorm, mapping{shift: norm})
		} else {
			add("ffn_norm.weight", decoder.PostNorm, mapping{shift: norm})
		}
		// The queries' rescaling goes where it multiplies q alone: the q norm when there is one, else q_proj.
		projScale := qScale
		if cfg.QKNorm {
			add("attn_q_norm.weight", decoder.QNorm, mapping{shift: norm, scale: qScale})
			add("attn_k_norm.weight", decoder.KNorm, mapping{shift: norm})
			projScale = 1
		}
		type lin struct {
			g, h string
			m    mapping
		}
		var lins []lin
		if cfg.FusedQKV {
			lins = append(lins, lin{"attn_qkv", decoder.QKVProj, mapping{}})
		} else {
			lins = append(lins, lin{"attn_q", decoder.QProj, mapping{heads: heads(cfg.NumAttentionHeads), scale: projScale}},
				lin{"attn_k", decoder.KProj, mapping{heads: heads(cfg.NumKeyValueHeads)}}, lin{"attn_v", decoder.VProj, mapping{}})
		}
		lins = append(lins, lin{"attn_output", decoder.OProj, mapping{}})
		if cfg.FusedGateUp {
			lins = append(lins, lin{"ffn_up", decoder.GateUpProj, mapping{}}) // gate rows first, as llama.cpp's SwiGLU split wants
		} else {
			lins = append(lins, lin{"ffn_gate", decoder.GateProj, mapping{}}, lin{"ffn_up", decoder.UpProj, mapping{}})
		}
		lins = append(lins, lin{"ffn_down", decoder.DownProj, mapping{}})
		for _, l := range lins {
			add(l.g+".weight", l.h+".weight", l.m)
			if has(pre + l.h + ".bias") {
				add(l.g+".bias", l.h+".bias", l.m)
			}
		}
	}
	return out
}

// store returns x (the Hugging Face tensor of m, rows of cols values) as the file holds it; load is its inverse.
func (m mapping) store(x []float32, cols int) []float32 {
	if m.heads > 0 {
		x = permute(x, m.heads, cols, false)
	}
	if m.shift != 0 || (m.scale != 0 && m.scale != 1) {
		x = slices.Clone(x)
		for i := range x {
			x[i] = (x[i] + m.shift) * m.factor()
		}
	}
	return x
}

func (m mapping) load(x []float32, cols int) []float32 {
	if m.shift != 0 || (m.scale != 0 && m.scale != 1) {
		for i := range x {
			x[i] = x[i]/m.factor() - m.shift
		}
	}
	if m.heads > 0 {
		x = permute(x, m.heads, cols, true)
	}
	return x
}

func (m mapping) factor() float32 {
	if m.scale == 0 {
		return 1
	}
	return m.scale
}

// permute reorders the rows of a q or k projection (rows = heads * headDim, each row cols values) from Hugging
// Face's rotate-half layout (row h*hd + i*hd/2 + j, i the half) to GGUF's interleaved one (row h*hd + 2j + i),
// as llama.cpp's converter does; inverse undoes it.
func permute(x []float32, heads, cols int, inverse bool) []float32 {
	rows := len(x) / cols
	hd := rows / heads
	half := hd / 2
	out := make([]float32, len(x))
	for h := range heads {
		for i := range 2 {
			for j := range half {
				hf, gg := h*hd+i*half+j, h*hd+2*j+i
				src, dst := hf, gg
				if inverse {
					src, dst = gg, hf
				}
				copy(out[dst*cols:(dst+1)*cols], x[src*cols:(src+1)*cols])
			}
		}
	}
	return out
}

// Options are Write's choices.
type Options struct {
	// Type is the type of the matrices: f32, f16, bf16 or q8_0 (a matrix whose rows are not a multiple of 32
	// values falls back to f16 under q8_0, as llama.cpp's converter does). Norms and rope factors stay f32.
	Type gguf.TensorType
	// Arch is llama.cpp's architecture to write (general.architecture: Archs; "" is Arch, llama).
	Arch string
	// ModelType is the config's model_type, recorded for memfit's reading ("": not recorded).
	ModelType string
	// Name is general.name.
	Name string
	// Vocab is the tokenizer (nil: PlaceholderVocab, token ids only).
	Vocab *tokenizer.GGUFVocab
	// Progress, when set, is told how many of the tensors are written (before each one, and Write tells it when
	// all are).
	Progress func(done, total int)
	// Note, when set, is told what a user should know about how llama.cpp runs the file (one line each).
	Note func(string)
}

// Check says why cfg's model cannot be written as a GGUF file of architecture archName ("": llama), or nil.
func Check(cfg decoder.Config, archName string) error {
	if cfg.Task != decoder.CausalLM {
		return fmt.Errorf("GGUF export is for causal LMs; this model is a sequence classifier")
	}
	if archName == "" {
		archName = Arch
	}
	a, err := archOf(archName)
	if err != nil {
		return err
	}
	if cfg.HeadDim%2 != 0 {
		return fmt.Errorf("head_dim %d is odd: rotary embeddings need an even one", cfg.HeadDim)
	}
	return a.check(cfg)
}

// Plan returns the metadata and tensors of cfg's model with params (float32, Hugging Face names) as a GGUF file
// of architecture o.Arch: gguf.WriteFile writes them, converting one tensor at a time.
func Plan(cfg decoder.Config, params models.Params, o Options) ([]gguf.KV, []gguf.Tensor, error) {
	if err := Check(cfg, o.Arch); err != nil {
		return nil, nil, err
	}
	a, _ := archOf(cmp.Or(o.Arch, Arch))
	if o.Note != nil {
		for _, n := range a.notes(cfg) {
			o.Note(n)
		}
	}
	v := o.Vocab
	if v == nil {
		v = PlaceholderVocab(cfg)
	}
	name := o.Name
	if phi3Named(name) && !hasTokens(v, phi3Tokens...) {
		// llama.cpp gives a model named like Phi-3 Phi-3's special-token attributes, looking up these tokens by
		// text: it fails to load one whose vocabulary lacks any of them.
		name = ""
		if o.Note != nil {
			o.Note(fmt.Sprintf("general.name %q is left out: llama.cpp cannot load a model named like Phi-3 whose vocabulary lacks any of %s",
				o.Name, strings.Join(phi3Tokens, " ")))
		}
	}
	u32 := func(n int) uint32 { return uint32(n) }
	meta := []gguf.KV{
		{Key: "general.architecture", Value: a.name},
		{Key: "general.name", Value: name},
		{Key: "general.file_type", Value: FileType(o.Type)},
	}
	if o.Type == gguf.Q8_0 {
		meta = append(meta, gguf.KV{Key: "general.quantization_version", Value: uint32(2)})
	}
	if o.ModelType != "" {
		meta = append(meta, gguf.KV{Key: keyModelType, Value: o.ModelType})
	}
	kv := func(k string, v any) { meta = append(meta, gguf.KV{Key: a.key(k), Value: v}) }
	kv("vocab_size", u32(cfg.VocabSize))
	kv("context_length", u32(cfg.MaxPositionEmbeddings))
	kv("embedding_length", u32(cfg.HiddenSize))
	kv("block_count", u32(cfg.NumHiddenLayers))
	kv("feed_forward_length", u32(cfg.IntermediateSize))
	kv("attention.head_count", u32(cfg.NumAttentionHeads))
	kv("attention.head_count_kv", u32(cfg.NumKeyValueHeads))
	kv("attention.key_length", u32(cfg.HeadDim))
	kv("attention.value_length", u32(cfg.HeadDim))
	kv("rope.dimension_count", u32(cfg.RotaryDim()))
	kv("rope.freq_base", float32(cfg.RopeTheta))
	kv("attention.layer_norm_rms_epsilon", float32(cfg.RMSNormEps))
	if cfg.RotaryDim() != cfg.HeadDim {
		meta = append(meta, gguf.KV{Key: keyPartialRotary, Value: cfg.PartialRotary})
	}
	var ts []gguf.Tensor
	f32 := func(name string, x []float32) {
		ts = append(ts, gguf.Tensor{Info: gguf.TensorInfo{Name: name, Dims: []uint64{uint64(len(x))}, Type: gguf.F32},
			Values: func() ([]float32, error) { return x, nil }})
	}
	if s := cfg.RopeScaling; s != nil {
		switch s.Type {
		case decoder.RopeLinear:
			kv("rope.scaling.type", "linear")
			kv("rope.scaling.factor", float32(s.Factor))
		case decoder.RopeLongRope:
			// llama.cpp divides each rotary frequency by the short factors, or the long ones when its context is
			// longer than the original, and multiplies cos and sin by attn_factor (as llama.cpp's converter writes
			// Phi-3, without a rope.scaling.type).
			kv("rope.scaling.attn_factor", cfg.RopeFor(false, 0).Scale)
			kv("rope.scaling.original_context_length", u32(s.OriginalMaxPositionEmbeddings))
			f32("rope_factors_long.weight", toF32(s.LongFactor))
			f32("rope_factors_short.weight", toF32(s.ShortFactor))
		default:
			// llama.cpp divides each rotary frequency by rope_freqs[i]: the ratio of the plain frequency to the
			// scaled one, which memfit computes as transformers does.
			meta = append(meta, gguf.KV{Key: keyL3Factor, Value: s.Factor}, gguf.KV{Key: keyL3Low, Value: s.LowFreqFactor},
				gguf.KV{Key: keyL3High, Value: s.HighFreqFactor}, gguf.KV{Key: keyL3Original, Value: u32(s.OriginalMaxPositionEmbeddings)})
			f32("rope_freqs.weight", ropeFactors(cfg, s))
		}
	}
	if a.localRope && cfg.LocalRopeTheta > 0 {
		kv("rope.freq_base_swa", float32(cfg.LocalRopeTheta))
	}
	if sliding := slices.Contains(cfg.Sliding, true); sliding || a.swaAlways {
		// The window and which layers slide (gemma2 always runs its sliding pattern: all false when none slide).
		if sliding {
			kv("attention.sliding_window", u32(cfg.SlidingWindow))
		}
		pattern := make([]bool, cfg.NumHiddenLayers)
		for i := range pattern {
			pattern[i] = cfg.IsSliding(i)
		}
		kv("attention.sliding_window_pattern", pattern)
	}
	softcap := func(mode capMode, v float64, key, memfitKey string) {
		switch {
		case v > 0 && mode != capNone:
			kv(key, float32(v))
		case mode == capAlways:
			kv(key, float32(noCap))
			meta = append(meta, gguf.KV{Key: memfitKey, Value: float32(0)})
		}
	}
	softcap(a.attnCap, cfg.AttnSoftCap, "attn_logit_softcapping", keyAttnCap)
	softcap(a.finalCap, cfg.FinalSoftCap, "final_logit_softcapping", keyFinalCap)
	if a.queryScale(cfg) != 1 {
		meta = append(meta, gguf.KV{Key: keyQueryScalar, Value: cfg.QueryPreAttnScalar})
	}
	meta = append(meta, vocabMeta(v)...)
	has := func(name string) bool { _, ok := params[name]; return ok }
	for _, m := range mappings(a, cfg, has) {
		p, ok := params[m.hf]
		if !ok {
			return nil, nil, fmt.Errorf("the model has no %s", m.hf)
		}
		dims := p.Shape().Dimensions
		gd := make([]uint64, len(dims))
		for i, d := range dims {
			gd[len(dims)-1-i] = uint64(d)
		}
		typ := o.Type
		switch {
		case len(dims) == 1:
			typ = gguf.F32
		case typ == gguf.Q8_0 && gd[0]%gguf.QK8_0 != 0:
			typ = gguf.F16
		}
		cols := 1
		if len(dims) == 2 {
			cols = dims[1]
		}
		ts = append(ts, gguf.Tensor{Info: gguf.TensorInfo{Name: m.gguf, Dims: gd, Type: typ}, Values: func() ([]float32, error) {
			x, err := params.Float32s(m.hf)
			if err != nil {
				return nil, err
			}
			return m.store(x, cols), nil
		}})
	}
	if o.Progress != nil {
		for i := range ts {
			values := ts[i].Values
			ts[i].Values = func() ([]float32, error) {
				o.Progress(i, len(ts))
				return values()
			}
		}
	}
	return meta, ts, nil
}

// Write writes cfg's model with params and the options' vocabulary to path as a GGUF file, atomically.
func Write(path string, cfg decoder.Config, params models.Params, o Options) error {
	meta, ts, err := Plan(cfg, params, o)
	if err != nil {
		return err
	}
	if err := gguf.WriteFile(path, meta, ts); err != nil {
		return err
	}
	if o.Progress != nil {
		o.Progress(len(ts), len(ts))
	}
	return nil
}

// phi3Tokens are the tokens llama.cpp looks up in the vocabulary of a model whose general.name says Phi-3.
var phi3Tokens = []string{"</s>", "<unk>", "<s>", "<|endoftext|>"}

// phi3Named reports whether llama.cpp takes a model of this general.name for a Phi-3 (llama-vocab.cpp: the
// lowercased name contains "phi-3" or "phi3").
func phi3Named(name string) bool {
	n := strings.ToLower(name)
	return strings.Contains(n, "phi-3") || strings.Contains(n, "phi3")
}

// hasTokens reports whether v holds every one of the tokens (by text).
func hasTokens(v *tokenizer.GGUFVocab, tokens ...string) bool {
	for _, t := range tokens {
		if !slices.Contains(v.Tokens, t) {
			return false
		}
	}
	return true
}

func toF32(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

// IsGGUF reports whether path names a GGUF file (by its .gguf extension).
func IsGGUF(path string) bool { return strings.HasSuffix(strings.ToLower(path), ".gguf") }
