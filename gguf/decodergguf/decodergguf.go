// Package decodergguf converts a causal LM of the decoder graph (models/decoder: LLaMA, Qwen, Mistral, Gemma,
// Phi-3) between memfit's Hugging Face layout (decoder.Config, parameters by Hugging Face name, the tokenizer) and a
// GGUF file as llama.cpp's convert_hf_to_gguf.py writes it for one of llama.cpp's architectures (Arch: llama,
// qwen2, qwen3, gemma2, gemma3, phi3): llama.cpp's tensor names (token_embd, blk.N.attn_q, ...), the q and k rows
// permuted from Hugging Face's rotate-half rotary layout to the interleaved one where the architecture rotates
// adjacent pairs (llama), Gemma's norm weights stored as 1 + w, the <arch>.* hyperparameters, rope_freqs for
// Llama-3.1 rope scaling and the long/short factors of longrope, and the tokenizer.* vocabulary. Read is Plan's
// inverse, so memfit runs a GGUF it wrote (or llama.cpp's converter wrote, for the same features) as it runs the
// Hugging Face folder.
package decodergguf

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// Arch is one of llama.cpp's architectures as this package writes and reads it: its general.architecture name
// (also the prefix of its hyperparameter keys), its rotary layout, and what of a decoder's config it cannot
// carry. A family declares the one it exports as (family/lm's Spec).
type Arch struct {
	// Name is general.architecture: "llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3".
	Name string
	// Interleaved: llama.cpp rotates adjacent pairs of dimensions (LLAMA_ROPE_TYPE_NORM), so the converter
	// permutes the q and k rows from Hugging Face's rotate-half layout; false: it rotates halves (NEOX), rows
	// as they are.
	Interleaved bool
	// Check returns why a config cannot be exported as this architecture (what llama.cpp hard-codes for it and
	// the config contradicts), or nil; Notes what llama.cpp does differently and the export goes on with.
	Check func(c decoder.Config) error
	Notes func(c decoder.Config) []string
}

// Llama is llama.cpp's llama architecture (LLaMA, and Mistral as its converter writes it): interleaved rotary,
// none of the other families' switches, Llama-3.1's rope scaling as rope_freqs. Its attention is full: a model
// with sliding-window layers exports with a note (llama.cpp's outputs equal memfit's up to the window).
var Llama = Arch{Name: "llama", Interleaved: true, Check: plain("llama"), Notes: fullAttention("llama")}

// Qwen2 and Qwen3 are llama.cpp's qwen2 (q/k/v biases) and qwen3 (q/k norms) architectures: rotate-half rotary,
// full attention (sliding-window layers export with a note).
var (
	Qwen2 = Arch{Name: "qwen2", Check: plain("qwen2"), Notes: fullAttention("qwen2")}
	Qwen3 = Arch{Name: "qwen3", Check: plain("qwen3"), Notes: fullAttention("qwen3")}
)

// Gemma2 and Gemma3 are llama.cpp's gemma2 and gemma3 architectures. llama.cpp hard-codes what their configs say:
// the sliding layers (every other layer from the first for Gemma 2, five in six for Gemma 3), the sliding layers'
// RoPE base (10000, unscaled, Gemma 3), the score scale (1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 27B
// shapes), Gemma 2's soft-caps (always on: 50 and 30 unless the file says otherwise) and Gemma 3's absence of
// them, so a config that differs is refused.
var (
	Gemma2 = Arch{Name: "gemma2", Check: gemmaCheck("gemma2", 2, 46, true)}
	Gemma3 = Arch{Name: "gemma3", Check: gemmaCheck("gemma3", 6, 62, false)}
)

// Phi3 is llama.cpp's phi3 architecture: fused qkv and gate_up, partial rotary, longrope as rope_factors_long and
// rope_factors_short. llama.cpp disables Phi-3's sliding window (its attention is full: such a model exports with
// a note) and chooses the long factors by the context it is run with, not by the sequence.
var Phi3 = Arch{Name: "phi3", Check: plain("phi3"), Notes: func(c decoder.Config) []string {
	out := fullAttention("phi3")(c)
	if s := c.RopeScaling; s != nil && s.Type == decoder.RopeLongRope {
		out = append(out, fmt.Sprintf("llama.cpp takes longrope's long factors when run with a context over %d tokens (original_max_position_embeddings), transformers and memfit when a sequence reaches past it", s.OriginalMaxPositionEmbeddings))
	}
	return out
}}

// Archs are the architectures this package writes and reads.
var Archs = []Arch{Llama, Qwen2, Qwen3, Gemma2, Gemma3, Phi3}

// ArchNamed returns the architecture of general.architecture name.
func ArchNamed(name string) (Arch, bool) {
	for _, a := range Archs {
		if a.Name == name {
			return a, true
		}
	}
	return Arch{}, false
}

// plain returns the Check of an architecture without Gemma's constraints: only the rope scalings llama.cpp reads
// for it (linear everywhere, Llama-3.1's rope_freqs on llama, longrope on phi3).
func plain(name string) func(decoder.Config) error {
	return func(c decoder.Config) error {
		s := c.RopeScaling
		switch {
		case s == nil || s.Type == decoder.RopeLinear:
		case s.Type == decoder.RopeLlama3 && name == "llama", s.Type == decoder.RopeLongRope && name == "phi3":
		default:
			return fmt.Errorf("llama.cpp's %s architecture has no %s rope scaling", name, s.Type)
		}
		if c.AttnSoftCap > 0 || c.FinalSoftCap > 0 || c.SandwichNorms || c.NormPlusOne || c.EmbedScale {
			return fmt.Errorf("llama.cpp's %s architecture has no Gemma norms, embedding scale or soft-caps", name)
		}
		return nil
	}
}

// fullAttention notes that an architecture's attention is full while the config has sliding layers.
func fullAttention(name string) func(decoder.Config) []string {
	return func(c decoder.Config) []string {
		if !slices.Contains(c.Sliding, true) {
			return nil
		}
		return []string{fmt.Sprintf("llama.cpp's %s architecture attends to the whole context: past sliding_window (%d tokens) its outputs differ from memfit's and transformers'", name, c.SlidingWindow)}
	}
}

// gemmaCheck returns the Check of a Gemma architecture whose sliding layers llama.cpp fixes as period - 1 in
// period (layer i sliding when (i+1) % period != 0), whose score scale is 1/sqrt(head_dim), but
// 1/sqrt(hidden/heads) at layers27B layers (the 27B model), and which soft-caps (both caps) or does not.
func gemmaCheck(name string, period, layers27B int, softcaps bool) func(decoder.Config) error {
	return func(c decoder.Config) error {
		if softcaps != (c.AttnSoftCap > 0) || softcaps != (c.FinalSoftCap > 0) {
			return fmt.Errorf("llama.cpp's %s architecture soft-caps the scores and the logits: %v; this model's caps are %g and %g", name, softcaps, c.AttnSoftCap, c.FinalSoftCap)
		}
		for i := range c.NumHiddenLayers {
			if c.IsSliding(i) != ((i+1)%period != 0) {
				return fmt.Errorf("llama.cpp's %s architecture makes layer i sliding when (i+1) %% %d != 0; this model's layer_types differ at layer %d", name, period, i)
			}
		}
		scalar := float64(c.HeadDim)
		if c.NumHiddenLayers == layers27B {
			scalar = float64(c.HiddenSize) / float64(c.NumAttentionHeads)
		}
		if q := c.QueryPreAttnScalar; q > 0 && q != scalar {
			return fmt.Errorf("llama.cpp's %s architecture scales the scores by 1/sqrt(%g); this model's query_pre_attn_scalar is %g", name, scalar, q)
		}
		if c.LocalRopeTheta > 0 && c.LocalRopeTheta != 10000 {
			return fmt.Errorf("llama.cpp's %s architecture gives the sliding layers RoPE base 10000; this model's rope_local_base_freq is %g", name, c.LocalRopeTheta)
		}
		if s := c.RopeScaling; s != nil && s.Type != decoder.RopeLinear {
			return fmt.Errorf("llama.cpp's %s architecture has no %s rope scaling", name, s.Type)
		}
		if c.FusedQKV || c.FusedGateUp {
			return fmt.Errorf("llama.cpp's %s architecture has separate q/k/v and gate/up projections", name)
		}
		return nil
	}
}

// Keys of memfit's own metadata: Llama-3.1 rope scaling's settings, which llama.cpp keeps only as the
// rope_freqs factors they give (memfit needs them to rebuild the config).
const (
	keyL3Factor   = "memfit.rope_scaling.llama3.factor"
	keyL3Low      = "memfit.rope_scaling.llama3.low_freq_factor"
	keyL3High     = "memfit.rope_scaling.llama3.high_freq_factor"
	keyL3Original = "memfit.rope_scaling.llama3.original_max_position_embeddings"
)

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

// mapping pairs a GGUF tensor name with the Hugging Face parameter it holds; heads marks q/k projections (and
// their biases) whose rows are permuted, with the number of heads they hold; plusOne a norm stored as 1 + w.
type mapping struct {
	gguf, hf string
	heads    int
	plusOne  bool
}

// mappings lists the tensors of cfg's model as arch names them (those params has, for the optional ones:
// biases, the head).
func mappings(arch Arch, cfg decoder.Config, has func(string) bool) []mapping {
	norm := func(g, hf string) mapping { return mapping{gguf: g, hf: hf, plusOne: cfg.NormPlusOne} }
	out := []mapping{{gguf: "token_embd.weight", hf: decoder.EmbedTokens}, norm("output_norm.weight", decoder.FinalNorm)}
	if !cfg.TieWordEmbeddings || has(decoder.LMHead) {
		out = append(out, mapping{gguf: "output.weight", hf: decoder.LMHead})
	}
	qHeads, kHeads := 0, 0
	if arch.Interleaved {
		qHeads, kHeads = cfg.NumAttentionHeads, cfg.NumKeyValueHeads
	}
	for i := range cfg.NumHiddenLayers {
		pre, blk := decoder.LayerPrefix(i), fmt.Sprintf("blk.%d.", i)
		out = append(out, norm(blk+"attn_norm.weight", pre+decoder.InputNorm))
		type lin struct {
			g, h  string
			heads int
		}
		lins := []lin{{"attn_output", decoder.OProj, 0}, {"ffn_down", decoder.DownProj, 0}}
		if cfg.FusedQKV {
			lins = append(lins, lin{"attn_qkv", decoder.QKVProj, 0})
		} else {
			lins = append(lins, lin{"attn_q", decoder.QProj, qHeads}, lin{"attn_k", decoder.KProj, kHeads}, lin{"attn_v", decoder.VProj, 0})
		}
		if cfg.FusedGateUp {
			lins = append(lins, lin{"ffn_up", decoder.GateUpProj, 0}) // gate rows first, as llama.cpp's fused SwiGLU splits them
		} else {
			lins = append(lins, lin{"ffn_gate", decoder.GateProj, 0}, lin{"ffn_up", decoder.UpProj, 0})
		}
		for _, l := range lins {
			out = append(out, mapping{gguf: blk + l.g + ".weight", hf: pre + l.h + ".weight", heads: l.heads})
			if has(pre + l.h + ".bias") {
				out = append(out, mapping{gguf: blk + l.g + ".bias", hf: pre + l.h + ".bias", heads: l.heads})
			}
		}
		if cfg.QKNorm {
			out = append(out, norm(blk+"attn_q_norm.weight", pre+decoder.QNorm), norm(blk+"attn_k_norm.weight", pre+decoder.KNorm))
		}
		if cfg.SandwichNorms {
			out = append(out, norm(blk+"post_attention_norm.weight", pre+decoder.PostNorm), norm(blk+"ffn_norm.weight", pre+decoder.PreFFNorm),
				norm(blk+"post_ffw_norm.weight", pre+decoder.PostFFNorm))
		} else {
			out = append(out, norm(blk+"ffn_norm.weight", pre+decoder.PostNorm))
		}
	}
	return out
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
	// Name is general.name.
	Name string
	// Vocab is the tokenizer (nil: PlaceholderVocab, token ids only).
	Vocab *tokenizer.GGUFVocab
	// Progress, when set, is told how many of the tensors are written (before each one, and Write tells it when
	// all are).
	Progress func(done, total int)
	// Note, when set, is told what llama.cpp will do differently from memfit with the file (the architecture's
	// Notes), once per note, when the plan is made.
	Note func(string)
}

// Plan returns the metadata and tensors of cfg's model with params (float32, Hugging Face names) as a GGUF file
// of arch: gguf.WriteFile writes them, converting one tensor at a time. With params nil it only checks that cfg
// can be exported as arch (nil metadata and tensors).
func Plan(arch Arch, cfg decoder.Config, params models.Params, o Options) ([]gguf.KV, []gguf.Tensor, error) {
	if cfg.Task != decoder.CausalLM {
		return nil, nil, fmt.Errorf("GGUF export is for causal LMs; this model is a sequence classifier")
	}
	if arch.Check != nil {
		if err := arch.Check(cfg); err != nil {
			return nil, nil, err
		}
	}
	if params == nil {
		return nil, nil, nil
	}
	if arch.Notes != nil && o.Note != nil {
		for _, n := range arch.Notes(cfg) {
			o.Note(n)
		}
	}
	u32 := func(n int) uint32 { return uint32(n) }
	key := func(k string) string { return arch.Name + "." + k }
	meta := []gguf.KV{
		{Key: "general.architecture", Value: arch.Name},
		{Key: "general.name", Value: o.Name},
		{Key: "general.file_type", Value: FileType(o.Type)},
	}
	if o.Type == gguf.Q8_0 {
		meta = append(meta, gguf.KV{Key: "general.quantization_version", Value: uint32(2)})
	}
	meta = append(meta,
		gguf.KV{Key: key("vocab_size"), Value: u32(cfg.VocabSize)},
		gguf.KV{Key: key("context_length"), Value: u32(cfg.MaxPositionEmbeddings)},
		gguf.KV{Key: key("embedding_length"), Value: u32(cfg.HiddenSize)},
		gguf.KV{Key: key("block_count"), Value: u32(cfg.NumHiddenLayers)},
		gguf.KV{Key: key("feed_forward_length"), Value: u32(cfg.IntermediateSize)},
		gguf.KV{Key: key("attention.head_count"), Value: u32(cfg.NumAttentionHeads)},
		gguf.KV{Key: key("attention.head_count_kv"), Value: u32(cfg.NumKeyValueHeads)},
		gguf.KV{Key: key("attention.key_length"), Value: u32(cfg.HeadDim)},
		gguf.KV{Key: key("attention.value_length"), Value: u32(cfg.HeadDim)},
		gguf.KV{Key: key("rope.dimension_count"), Value: u32(cfg.RotaryDim())},
		gguf.KV{Key: key("rope.freq_base"), Value: float32(cfg.RopeTheta)},
		gguf.KV{Key: key("attention.layer_norm_rms_epsilon"), Value: float32(cfg.RMSNormEps)},
	)
	if slices.Contains(cfg.Sliding, true) {
		meta = append(meta, gguf.KV{Key: key("attention.sliding_window"), Value: u32(cfg.SlidingWindow)})
	}
	if cfg.AttnSoftCap > 0 {
		meta = append(meta, gguf.KV{Key: key("attn_logit_softcapping"), Value: float32(cfg.AttnSoftCap)})
	}
	if cfg.FinalSoftCap > 0 {
		meta = append(meta, gguf.KV{Key: key("final_logit_softcapping"), Value: float32(cfg.FinalSoftCap)})
	}
	var ts []gguf.Tensor
	f32 := func(name string, x []float32) gguf.Tensor {
		return gguf.Tensor{Info: gguf.TensorInfo{Name: name, Dims: []uint64{uint64(len(x))}, Type: gguf.F32},
			Values: func() ([]float32, error) { return x, nil }}
	}
	if s := cfg.RopeScaling; s != nil {
		switch s.Type {
		case decoder.RopeLinear:
			meta = append(meta, gguf.KV{Key: key("rope.scaling.type"), Value: "linear"},
				gguf.KV{Key: key("rope.scaling.factor"), Value: float32(s.Factor)})
		case decoder.RopeLongRope:
			// llama.cpp divides the frequencies by the long or the short factors and scales cos and sin by
			// attn_factor, as the config's longrope does.
			meta = append(meta, gguf.KV{Key: key("rope.scaling.attn_factor"), Value: float32(cfg.RopeFor(false, 0).Scale)},
				gguf.KV{Key: key("rope.scaling.original_context_length"), Value: u32(s.OriginalMaxPositionEmbeddings)})
			ts = append(ts, f32("rope_factors_long.weight", float32s(s.LongFactor)), f32("rope_factors_short.weight", float32s(s.ShortFactor)))
		default:
			// llama.cpp divides each rotary frequency by rope_freqs[i]: the ratio of the plain frequency to the
			// scaled one, which memfit computes as transformers does.
			meta = append(meta, gguf.KV{Key: keyL3Factor, Value: s.Factor}, gguf.KV{Key: keyL3Low, Value: s.LowFreqFactor},
				gguf.KV{Key: keyL3High, Value: s.HighFreqFactor}, gguf.KV{Key: keyL3Original, Value: u32(s.OriginalMaxPositionEmbeddings)})
			ts = append(ts, f32("rope_freqs.weight", ropeFactors(cfg, s)))
		}
	}
	v := o.Vocab
	if v == nil {
		v = PlaceholderVocab(cfg)
	}
	meta = append(meta, vocabMeta(v)...)
	has := func(name string) bool { _, ok := params[name]; return ok }
	for _, m := range mappings(arch, cfg, has) {
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
		m := m
		cols := 1
		if len(dims) == 2 {
			cols = dims[1]
		}
		ts = append(ts, gguf.Tensor{Info: gguf.TensorInfo{Name: m.gguf, Dims: gd, Type: typ}, Values: func() ([]float32, error) {
			x, err := params.Float32s(m.hf)
			if err != nil {
				return nil, err
			}
			if m.plusOne { // Gemma's norms: llama.cpp multiplies by the stored weight, as its converter writes 1 + w
				for i := range x {
					x[i]++
				}
			}
			if m.heads > 0 {
				x = permute(x, m.heads, cols, false)
			}
			return x, nil
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

// float32s returns x as float32s.
func float32s(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

// Write writes cfg's model with params and the options' vocabulary to path as a GGUF file of arch, atomically.
func Write(path string, arch Arch, cfg decoder.Config, params models.Params, o Options) error {
	meta, ts, err := Plan(arch, cfg, params, o)
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

// PlaceholderVocab is the vocabulary of a model without a tokenizer, so that llama.cpp loads the file and runs
// token ids (its tokenizer "none" cannot be loaded by most llama.cpp tools): a SentencePiece-type vocabulary
// whose ids below 256 are the byte tokens "<0xNN>" (llama.cpp needs them to encode any text) and the others
// placeholder tokens "<memfit_token_N>"; BOS, EOS and pad are the config's ids (placeholders, control tokens);
// nothing is added to what is encoded.
func PlaceholderVocab(cfg decoder.Config) *tokenizer.GGUFVocab {
	v := &tokenizer.GGUFVocab{Model: tokenizer.GGUFSentencePiece, Pre: "default", BOS: cfg.BOSTokenID, EOS: cfg.EOSTokenID, UNK: -1, Pad: cfg.PadTokenID,
		Tokens: make([]string, cfg.VocabSize), Types: make([]int32, cfg.VocabSize), Scores: make([]float32, cfg.VocabSize)}
	for _, id := range []*int{&v.BOS, &v.EOS, &v.Pad} {
		if *id >= cfg.VocabSize {
			*id = -1
		}
	}
	for i := range v.Tokens {
		switch {
		case i == v.BOS || i == v.EOS || i == v.Pad:
			v.Tokens[i], v.Types[i] = fmt.Sprintf(PlaceholderToken, i), tokenizer.GGUFControl
		case i < 256:
			// llama.cpp's SentencePiece tokenizer falls back to byte tokens for any text (and fails without them).
			v.Tokens[i], v.Types[i] = fmt.Sprintf("<0x%02X>", i), tokenizer.GGUFByte
		default:
			v.Tokens[i], v.Types[i] = fmt.Sprintf(PlaceholderToken, i), tokenizer.GGUFUserDefined
		}
	}
	return v
}

// PlaceholderToken is the text of token N in PlaceholderVocab.
const PlaceholderToken = "<memfit_token_%d>"

// vocabMeta returns the tokenizer.* metadata of v.
func vocabMeta(v *tokenizer.GGUFVocab) []gguf.KV {
	meta := []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: v.Model},
		{Key: "tokenizer.ggml.pre", Value: v.Pre},
		{Key: "tokenizer.ggml.tokens", Value: v.Tokens},
	}
	if v.Scores != nil {
		meta = append(meta, gguf.KV{Key: "tokenizer.ggml.scores", Value: v.Scores})
	}
	meta = append(meta, gguf.KV{Key: "tokenizer.ggml.token_type", Value: v.Types})
	if v.Model == tokenizer.GGUFByteLevelBPE {
		meta = append(meta, gguf.KV{Key: "tokenizer.ggml.merges", Value: v.Merges})
	}
	for _, id := range []struct {
		key string
		id  int
	}{{"tokenizer.ggml.bos_token_id", v.BOS}, {"tokenizer.ggml.eos_token_id", v.EOS}, {"tokenizer.ggml.unknown_token_id", v.UNK},
		{"tokenizer.ggml.padding_token_id", v.Pad}} {
		if id.id >= 0 {
			meta = append(meta, gguf.KV{Key: id.key, Value: uint32(id.id)})
		}
	}
	meta = append(meta, gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: v.AddBOS}, gguf.KV{Key: "tokenizer.ggml.add_eos_token", Value: v.AddEOS})
	if v.Model == tokenizer.GGUFSentencePiece {
		meta = append(meta, gguf.KV{Key: "tokenizer.ggml.add_space_prefix", Value: v.AddSpacePrefix})
	}
	if v.ChatTemplate != "" {
		meta = append(meta, gguf.KV{Key: "tokenizer.chat_template", Value: v.ChatTemplate})
	}
	return meta
}

// Model is a decoder read from a GGUF file.
type Model struct {
	// Arch is the file's architecture.
	Arch   Arch
	Config decoder.Config
	Params models.Params
	// Tokenizer is nil when the file has none (tokenizer.ggml.model "none").
	Tokenizer *tokenizer.Tokenizer
	// Type is the type of the file's matrices: q8_0 when any is, else f16 when any is, else f32.
	Type gguf.TensorType
}

// Read reads a GGUF file of one of Archs: its config from the <arch>.* metadata and the architecture's fixed
// choices (Gemma's norms, pattern and scale), its tensors dequantised to float32 under their Hugging Face names
// (the q/k permutation and Gemma's 1 + w undone), and its tokenizer. Anything the file lacks, a tensor of the
// wrong shape, or a name memfit does not know is an error naming it.
func Read(path string) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

func read(f *gguf.File) (*Model, error) {
	name, _, err := f.String("general.architecture")
	if err != nil {
		return nil, err
	}
	arch, ok := ArchNamed(name)
	if !ok {
		names := make([]string, len(Archs))
		for i, a := range Archs {
			names[i] = a.Name
		}
		return nil, fmt.Errorf("general.architecture is %q: memfit reads GGUF files of the architectures %v", name, names)
	}
	key := func(k string) string { return arch.Name + "." + k }
	r := metaReader{f: f}
	cfg := decoder.Config{Task: decoder.CausalLM, Activation: decoder.ActSiLU, PadTokenID: -1, BOSTokenID: -1, EOSTokenID: -1}
	cfg.HiddenSize = r.int(key("embedding_length"), true, 0)
	cfg.NumHiddenLayers = r.int(key("block_count"), true, 0)
	cfg.IntermediateSize = r.int(key("feed_forward_length"), true, 0)
	cfg.NumAttentionHeads = r.int(key("attention.head_count"), true, 0)
	cfg.NumKeyValueHeads = r.int(key("attention.head_count_kv"), false, cfg.NumAttentionHeads)
	defHead := 0
	if cfg.NumAttentionHeads > 0 {
		defHead = cfg.HiddenSize / cfg.NumAttentionHeads
	}
	cfg.HeadDim = r.int(key("attention.key_length"), false, defHead)
	if v := r.int(key("attention.value_length"), false, cfg.HeadDim); v != cfg.HeadDim {
		return nil, fmt.Errorf("%s %d differs from key_length %d: memfit's decoder uses one head size", key("attention.value_length"), v, cfg.HeadDim)
	}
	if rd := r.int(key("rope.dimension_count"), false, cfg.HeadDim); rd != cfg.HeadDim && cfg.HeadDim > 0 {
		cfg.PartialRotary = float64(rd) / float64(cfg.HeadDim)
	}
	cfg.MaxPositionEmbeddings = r.int(key("context_length"), true, 0)
	cfg.RopeTheta = r.float(key("rope.freq_base"), 10000)
	cfg.RMSNormEps = r.float(key("attention.layer_norm_rms_epsilon"), 1e-5)
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 {
		return nil, fmt.Errorf("no token_embd.weight matrix")
	}
	cfg.VocabSize = r.int(key("vocab_size"), false, int(min(emb.Dims[1], math.MaxInt32)))
	if st, _, err := f.String(key("rope.scaling.type")); err != nil {
		return nil, err
	} else if st == "linear" {
		cfg.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLinear, Factor: r.float(key("rope.scaling.factor"), 1)}
	} else if st != "" && st != "none" {
		return nil, fmt.Errorf("%s %q is not supported (linear, Llama-3.1's rope_freqs or Phi-3's longrope factors)", key("rope.scaling.type"), st)
	}
	if err := readLongRope(f, &r, arch, &cfg); err != nil {
		return nil, err
	}
	if ti, ok := f.Tensor("rope_freqs.weight"); ok {
		if r.err != nil {
			return nil, r.err
		}
		if len(ti.Dims) != 1 || ti.Dims[0] != uint64(cfg.HeadDim/2) {
			return nil, fmt.Errorf("rope_freqs.weight has dimensions %v, want [%d] (head_dim / 2)", ti.Dims, cfg.HeadDim/2)
		}
		freqs, err := f.Float32s("rope_freqs.weight")
		if err != nil {
			return nil, err
		}
		if _, ok := f.Value(keyL3Factor); ok {
			cfg.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLlama3, Factor: r.float(keyL3Factor, 0), LowFreqFactor: r.float(keyL3Low, 0),
				HighFreqFactor: r.float(keyL3High, 0), OriginalMaxPositionEmbeddings: r.int(keyL3Original, true, 0)}
			if r.err == nil && !ropeFactorsMatch(cfg, cfg.RopeScaling, freqs) {
				return nil, fmt.Errorf("rope_freqs.weight disagrees with the %s settings in the metadata", "memfit.rope_scaling.llama3")
			}
		} else if cfg.RopeScaling, err = inferLlama3(cfg, freqs); err != nil {
			return nil, err
		}
	}
	has := func(name string) bool { _, ok := f.Tensor(name); return ok }
	cfg.TieWordEmbeddings = !has("output.weight")
	cfg.FusedQKV = has("blk.0.attn_qkv.weight")
	cfg.FusedGateUp = !has("blk.0.ffn_gate.weight")
	cfg.QKNorm = has("blk.0.attn_q_norm.weight")
	cfg.SandwichNorms = has("blk.0.post_attention_norm.weight")
	qBias := has("blk.0.attn_q.bias") || has("blk.0.attn_qkv.bias")
	cfg.AttentionBias = qBias && has("blk.0.attn_output.bias")
	cfg.QKVBias = qBias && !cfg.AttentionBias
	cfg.MLPBias = has("blk.0.ffn_up.bias")
	window := r.int(key("attention.sliding_window"), false, 0)
	if strings.HasPrefix(arch.Name, "gemma") {
		// What llama.cpp hard-codes for Gemma (gemmaCheck): (1 + w) norms, the scaled embeddings, GeGLU with the tanh
		// GELU, the sliding pattern, the score scale, Gemma 2's default caps and Gemma 3's local base.
		cfg.NormPlusOne, cfg.EmbedScale, cfg.Activation = true, true, decoder.ActGELUTanh
		period, layers27B := 2, 46
		if arch.Name == "gemma3" {
			period, layers27B, cfg.LocalRopeTheta = 6, 62, 10000
		} else {
			cfg.AttnSoftCap, cfg.FinalSoftCap = r.float(key("attn_logit_softcapping"), 50), r.float(key("final_logit_softcapping"), 30)
		}
		if window == 0 {
			window = 4096
		}
		cfg.SlidingWindow, cfg.Sliding = window, make([]bool, cfg.NumHiddenLayers)
		for i := range cfg.Sliding {
			cfg.Sliding[i] = (i+1)%period != 0
		}
		cfg.QueryPreAttnScalar = float64(cfg.HeadDim)
		if cfg.NumHiddenLayers == layers27B && cfg.NumAttentionHeads > 0 {
			cfg.QueryPreAttnScalar = float64(cfg.HiddenSize) / float64(cfg.NumAttentionHeads)
		}
	} else if window > 0 {
		// The window of every layer, as the model was (llama.cpp itself attends to the whole context: Notes).
		cfg.SlidingWindow, cfg.Sliding = window, make([]bool, cfg.NumHiddenLayers)
		for i := range cfg.Sliding {
			cfg.Sliding[i] = true
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	tok, err := readVocab(f)
	if err != nil {
		return nil, err
	}
	if tok != nil {
		if id, ok := tok.BOS(); ok {
			cfg.BOSTokenID = id
		}
		if id, ok := tok.EOS(); ok {
			cfg.EOSTokenID, cfg.EOSTokenIDs = id, []int{id}
		}
		if id, ok := tok.Pad(); ok {
			cfg.PadTokenID = id
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("the %s.* metadata: %w", arch.Name, err)
	}
	shapes := decoder.Shapes(cfg)
	maps := mappings(arch, cfg, func(name string) bool { _, ok := shapes[name]; return ok })
	known := map[string]mapping{"rope_freqs.weight": {}, "rope_factors_long.weight": {}, "rope_factors_short.weight": {}}
	for _, m := range maps {
		known[m.gguf] = m
	}
	params := models.Params{}
	typ := gguf.F32
	for _, ti := range f.Tensors {
		m, ok := known[ti.Name]
		if !ok {
			return nil, fmt.Errorf("tensor %s is not one of a %s model of this config", ti.Name, arch.Name)
		}
		if m.hf == "" {
			continue
		}
		want := shapes[m.hf]
		if len(ti.Dims) != len(want) {
			return nil, fmt.Errorf("tensor %s has dimensions %v, want %d of them (%s %v)", ti.Name, ti.Dims, len(want), m.hf, want)
		}
		for i, d := range want {
			if ti.Dims[len(want)-1-i] != uint64(d) {
				return nil, fmt.Errorf("tensor %s has dimensions %v; the config gives %s the shape %v (GGUF lists them innermost first)", ti.Name, ti.Dims, m.hf, want)
			}
		}
		if len(want) == 2 && ti.Type != gguf.F32 && typ != gguf.Q8_0 {
			typ = ti.Type
		}
		x, err := f.Float32s(ti.Name)
		if err != nil {
			return nil, err
		}
		if m.heads > 0 {
			cols := 1
			if len(want) == 2 {
				cols = want[1]
			}
			x = permute(x, m.heads, cols, true)
		}
		if m.plusOne {
			for i := range x {
				x[i]--
			}
		}
		params[m.hf] = tensors.FromFlatDataAndDimensions(x, want...)
	}
	if err := models.CheckShapes(params, shapes); err != nil {
		return nil, err
	}
	return &Model{Arch: arch, Config: cfg, Params: params, Tokenizer: tok, Type: typ}, nil
}

// readLongRope reads Phi-3's longrope (rope_factors_long and rope_factors_short, the attention factor and the
// original context) into cfg, when the file has it.
func readLongRope(f *gguf.File, r *metaReader, arch Arch, cfg *decoder.Config) error {
	_, hasLong := f.Tensor("rope_factors_long.weight")
	_, hasShort := f.Tensor("rope_factors_short.weight")
	if !hasLong && !hasShort {
		return nil
	}
	if !hasLong || !hasShort {
		return fmt.Errorf("the file has one of rope_factors_long and rope_factors_short: longrope needs both")
	}
	long, err := f.Float32s("rope_factors_long.weight")
	if err != nil {
		return err
	}
	short, err := f.Float32s("rope_factors_short.weight")
	if err != nil {
		return err
	}
	widen := func(x []float32) []float64 {
		out := make([]float64, len(x))
		for i, v := range x {
			out[i], _ = strconv.ParseFloat(strconv.FormatFloat(float64(v), 'g', -1, 32), 64)
		}
		return out
	}
	key := arch.Name + ".rope.scaling."
	s := &decoder.RopeScaling{Type: decoder.RopeLongRope, LongFactor: widen(long), ShortFactor: widen(short),
		OriginalMaxPositionEmbeddings: r.int(key+"original_context_length", false, cfg.MaxPositionEmbeddings),
		AttentionFactor:               r.float(key+"attn_factor", 0)}
	if s.OriginalMaxPositionEmbeddings > 0 {
		s.Factor = float64(cfg.MaxPositionEmbeddings) / float64(s.OriginalMaxPositionEmbeddings)
	}
	if s.AttentionFactor > 0 {
		computed := *s
		computed.AttentionFactor = 0
		c := *cfg
		c.RopeScaling = &computed
		if math.Abs(float64(c.RopeFor(false, 0).Scale)-s.AttentionFactor) <= 1e-6*s.AttentionFactor {
			s.AttentionFactor = 0 // the default transformers computes, as the config had it
		}
	}
	cfg.RopeScaling = s
	return nil
}

// ropeFactors returns the rope_freqs factors of cfg with scaling s: per rotary frequency, the plain one over the
// scaled one.
func ropeFactors(cfg decoder.Config, s *decoder.RopeScaling) []float32 {
	plain, scaled := cfg, cfg
	plain.RopeScaling, scaled.RopeScaling = nil, s
	base, sc := plain.InvFreq(), scaled.InvFreq()
	out := make([]float32, len(base))
	for i := range out {
		out[i] = base[i] / sc[i]
	}
	return out
}

func ropeFactorsMatch(cfg decoder.Config, s *decoder.RopeScaling, freqs []float32) bool {
	want := ropeFactors(cfg, s)
	for i := range want {
		if d := math.Abs(float64(want[i] - freqs[i])); !(d <= 1e-5*math.Abs(float64(freqs[i]))) {
			return false
		}
	}
	return true
}

// inferLlama3 finds the Llama-3.1 rope scaling whose factors are freqs, for a file llama.cpp's converter wrote
// (it keeps only the factors): factor is the lowest frequency's, and the low/high frequency factors and the
// original context length are searched among the values Llama 3.x models use and powers of two.
func inferLlama3(cfg decoder.Config, freqs []float32) (*decoder.RopeScaling, error) {
	if len(freqs) == 0 || !(freqs[len(freqs)-1] >= 1) {
		return nil, fmt.Errorf("rope_freqs.weight %v is not a Llama-3.1 rope scaling", freqs)
	}
	factor, _ := strconv.ParseFloat(strconv.FormatFloat(float64(freqs[len(freqs)-1]), 'g', -1, 32), 64)
	for _, low := range []float64{1, 2} {
		for _, high := range []float64{4, 2, 8} {
			for orig := 1 << 13; orig >= 1<<7; orig /= 2 {
				s := &decoder.RopeScaling{Type: decoder.RopeLlama3, Factor: factor, LowFreqFactor: low, HighFreqFactor: high, OriginalMaxPositionEmbeddings: orig}
				if high > low && ropeFactorsMatch(cfg, s, freqs) {
					return s, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("rope_freqs.weight holds rope factors that match no Llama-3.1 rope scaling memfit tried (factor %g; low/high frequency factors 1-2/2-8, original context 128 to 8192)", factor)
}

// ReadTokenizer reads only the tokenizer of the GGUF file at path (nil when it has none).
func ReadTokenizer(path string) (*tokenizer.Tokenizer, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := readVocab(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// readVocab rebuilds the tokenizer of the tokenizer.* metadata (nil for "none" or no tokenizer).
func readVocab(f *gguf.File) (*tokenizer.Tokenizer, error) {
	model, ok, err := f.String("tokenizer.ggml.model")
	if err != nil || !ok || model == tokenizer.GGUFNoVocab || model == "no_vocab" {
		return nil, err
	}
	v := &tokenizer.GGUFVocab{Model: model, BOS: -1, EOS: -1, UNK: -1, Pad: -1, AddSpacePrefix: true}
	var errs []error
	get := func(key string, dst any) {
		val, ok := f.Value(key)
		if !ok {
			return
		}
		switch d := dst.(type) {
		case *[]string:
			if x, ok := val.([]string); ok {
				*d = x
				return
			}
		case *[]float32:
			if x, ok := val.([]float32); ok {
				*d = x
				return
			}
		case *[]int32:
			if x, ok := val.([]int32); ok {
				*d = x
				return
			}
		case *string:
			if x, ok := val.(string); ok {
				*d = x
				return
			}
		case *bool:
			if x, ok := val.(bool); ok {
				*d = x
				return
			}
		case *int:
			if n, ok, err := f.Uint(key); err == nil && ok {
				*d = int(min(n, math.MaxInt32))
				return
			}
		}
		errs = append(errs, fmt.Errorf("metadata %s is %T, not what a tokenizer holds there", key, val))
	}
	get("tokenizer.ggml.pre", &v.Pre)
	get("tokenizer.ggml.tokens", &v.Tokens)
	get("tokenizer.ggml.scores", &v.Scores)
	get("tokenizer.ggml.token_type", &v.Types)
	get("tokenizer.ggml.merges", &v.Merges)
	get("tokenizer.ggml.bos_token_id", &v.BOS)
	get("tokenizer.ggml.eos_token_id", &v.EOS)
	get("tokenizer.ggml.unknown_token_id", &v.UNK)
	get("tokenizer.ggml.padding_token_id", &v.Pad)
	get("tokenizer.ggml.add_bos_token", &v.AddBOS)
	get("tokenizer.ggml.add_eos_token", &v.AddEOS)
	get("tokenizer.ggml.add_space_prefix", &v.AddSpacePrefix)
	get("tokenizer.chat_template", &v.ChatTemplate)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	// A special token id outside the vocabulary (some converters write 2^32-1 for none) is absent, as llama.cpp
	// takes it.
	for _, id := range []*int{&v.BOS, &v.EOS, &v.UNK, &v.Pad} {
		if *id >= len(v.Tokens) {
			*id = -1
		}
	}
	t, err := tokenizer.FromGGUFVocab(v)
	if err != nil {
		return nil, fmt.Errorf("the tokenizer.* metadata: %w", err)
	}
	return t, nil
}

// metaReader reads required and optional numbers, keeping the first error.
type metaReader struct {
	f   *gguf.File
	err error
}

func (r *metaReader) int(key string, required bool, def int) int {
	n, ok, err := r.f.Uint(key)
	switch {
	case r.err != nil:
	case err != nil:
		r.err = err
	case !ok && required:
		r.err = fmt.Errorf("no %s in the metadata", key)
	case !ok:
		return def
	case n > 1<<31:
		r.err = fmt.Errorf("%s is %s, more than memfit takes", key, strconv.FormatUint(n, 10))
	default:
		return int(n)
	}
	return def
}

func (r *metaReader) float(key string, def float64) float64 {
	x, ok, err := r.f.Float(key)
	if v, _ := r.f.Value(key); ok {
		if f32, isF32 := v.(float32); isF32 {
			// A float32 value (rms eps, rope theta) as the shortest decimal that reads back to it: 1e-05, not
			// 9.999999747378752e-06, as the config.json it came from says.
			x, _ = strconv.ParseFloat(strconv.FormatFloat(float64(f32), 'g', -1, 32), 64)
		}
	}
	switch {
	case r.err != nil:
	case err != nil:
		r.err = err
	case !ok:
		return def
	case math.IsNaN(x) || math.IsInf(x, 0):
		r.err = fmt.Errorf("%s is %g", key, x)
	default:
		return x
	}
	return def
}

// IsGGUF reports whether path names a GGUF file (by its .gguf extension).
func IsGGUF(path string) bool { return strings.HasSuffix(strings.ToLower(path), ".gguf") }
