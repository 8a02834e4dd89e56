// Package llamagguf converts a LLaMA causal LM between memfit's Hugging Face layout (decoder.Config, parameters by
// Hugging Face name, the tokenizer) and a GGUF file as llama.cpp's convert_hf_to_gguf.py writes it: llama.cpp's
// tensor names (token_embd, blk.N.attn_q, ...), the query and key rows permuted from Hugging Face's rotate-half
// rotary layout to GGUF's interleaved one, the llama.* hyperparameters, rope_freqs for Llama-3.1 rope scaling,
// and the tokenizer.* vocabulary. Read is Write's inverse, so memfit runs a GGUF it wrote (or llama.cpp's
// converter wrote, for the same features) as it runs the Hugging Face folder.
package llamagguf

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// Arch is general.architecture of the files this package writes and reads.
const Arch = "llama"

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

// mapping pairs a GGUF tensor name with the Hugging Face parameter it holds; rope marks q/k projections (and
// their biases), whose rows are permuted, with the number of heads they hold.
type mapping struct {
	gguf, hf string
	heads    int
}

// mappings lists the tensors of cfg's model (those params has, for the optional ones: biases, the head).
func mappings(cfg decoder.Config, has func(string) bool) []mapping {
	out := []mapping{{gguf: "token_embd.weight", hf: decoder.EmbedTokens}, {gguf: "output_norm.weight", hf: decoder.FinalNorm}}
	if !cfg.TieWordEmbeddings || has(decoder.LMHead) {
		out = append(out, mapping{gguf: "output.weight", hf: decoder.LMHead})
	}
	for i := range cfg.NumHiddenLayers {
		pre, blk := decoder.LayerPrefix(i), fmt.Sprintf("blk.%d.", i)
		out = append(out, mapping{gguf: blk + "attn_norm.weight", hf: pre + decoder.InputNorm},
			mapping{gguf: blk + "ffn_norm.weight", hf: pre + decoder.PostNorm})
		for _, l := range []struct {
			g, h  string
			heads int
		}{{"attn_q", decoder.QProj, cfg.NumAttentionHeads}, {"attn_k", decoder.KProj, cfg.NumKeyValueHeads}, {"attn_v", decoder.VProj, 0},
			{"attn_output", decoder.OProj, 0}, {"ffn_gate", decoder.GateProj, 0}, {"ffn_up", decoder.UpProj, 0}, {"ffn_down", decoder.DownProj, 0}} {
			out = append(out, mapping{gguf: blk + l.g + ".weight", hf: pre + l.h + ".weight", heads: l.heads})
			if has(pre + l.h + ".bias") {
				out = append(out, mapping{gguf: blk + l.g + ".bias", hf: pre + l.h + ".bias", heads: l.heads})
			}
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
	// values falls back to f16 under q8_0, as llama.cpp's converter does). Norms and rope_freqs stay f32.
	Type gguf.TensorType
	// Name is general.name.
	Name string
	// Vocab is the tokenizer (nil: PlaceholderVocab, token ids only).
	Vocab *tokenizer.GGUFVocab
	// Progress, when set, is told how many of the tensors are written (before each one, and Write tells it when
	// all are).
	Progress func(done, total int)
}

// Plan returns the metadata and tensors of cfg's model with params (float32, Hugging Face names) as a GGUF file:
// gguf.WriteFile writes them, converting one tensor at a time.
func Plan(cfg decoder.Config, params models.Params, o Options) ([]gguf.KV, []gguf.Tensor, error) {
	if cfg.Task != decoder.CausalLM {
		return nil, nil, fmt.Errorf("GGUF export is for causal LMs; this model is a sequence classifier")
	}
	if cfg.HeadDim%2 != 0 {
		return nil, nil, fmt.Errorf("head_dim %d is odd: rotary embeddings need an even one", cfg.HeadDim)
	}
	u32 := func(n int) uint32 { return uint32(n) }
	meta := []gguf.KV{
		{Key: "general.architecture", Value: Arch},
		{Key: "general.name", Value: o.Name},
		{Key: "general.file_type", Value: FileType(o.Type)},
	}
	if o.Type == gguf.Q8_0 {
		meta = append(meta, gguf.KV{Key: "general.quantization_version", Value: uint32(2)})
	}
	meta = append(meta,
		gguf.KV{Key: "llama.vocab_size", Value: u32(cfg.VocabSize)},
		gguf.KV{Key: "llama.context_length", Value: u32(cfg.MaxPositionEmbeddings)},
		gguf.KV{Key: "llama.embedding_length", Value: u32(cfg.HiddenSize)},
		gguf.KV{Key: "llama.block_count", Value: u32(cfg.NumHiddenLayers)},
		gguf.KV{Key: "llama.feed_forward_length", Value: u32(cfg.IntermediateSize)},
		gguf.KV{Key: "llama.attention.head_count", Value: u32(cfg.NumAttentionHeads)},
		gguf.KV{Key: "llama.attention.head_count_kv", Value: u32(cfg.NumKeyValueHeads)},
		gguf.KV{Key: "llama.attention.key_length", Value: u32(cfg.HeadDim)},
		gguf.KV{Key: "llama.attention.value_length", Value: u32(cfg.HeadDim)},
		gguf.KV{Key: "llama.rope.dimension_count", Value: u32(cfg.HeadDim)},
		gguf.KV{Key: "llama.rope.freq_base", Value: float32(cfg.RopeTheta)},
		gguf.KV{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(cfg.RMSNormEps)},
	)
	var ts []gguf.Tensor
	if s := cfg.RopeScaling; s != nil {
		if s.Type == decoder.RopeLinear {
			meta = append(meta, gguf.KV{Key: "llama.rope.scaling.type", Value: "linear"},
				gguf.KV{Key: "llama.rope.scaling.factor", Value: float32(s.Factor)})
		} else {
			// llama.cpp divides each rotary frequency by rope_freqs[i]: the ratio of the plain frequency to the
			// scaled one, which memfit computes as transformers does.
			meta = append(meta, gguf.KV{Key: keyL3Factor, Value: s.Factor}, gguf.KV{Key: keyL3Low, Value: s.LowFreqFactor},
				gguf.KV{Key: keyL3High, Value: s.HighFreqFactor}, gguf.KV{Key: keyL3Original, Value: u32(s.OriginalMaxPositionEmbeddings)})
			factors := ropeFactors(cfg, s)
			ts = append(ts, gguf.Tensor{Info: gguf.TensorInfo{Name: "rope_freqs.weight", Dims: []uint64{uint64(len(factors))}, Type: gguf.F32},
				Values: func() ([]float32, error) { return factors, nil }})
		}
	}
	v := o.Vocab
	if v == nil {
		v = PlaceholderVocab(cfg)
	}
	meta = append(meta, vocabMeta(v)...)
	has := func(name string) bool { _, ok := params[name]; return ok }
	for _, m := range mappings(cfg, has) {
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
			if err != nil || m.heads == 0 {
				return x, err
			}
			return permute(x, m.heads, cols, false), nil
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

// Model is a LLaMA read from a GGUF file.
type Model struct {
	Config decoder.Config
	Params models.Params
	// Tokenizer is nil when the file has none (tokenizer.ggml.model "none").
	Tokenizer *tokenizer.Tokenizer
	// Type is the type of the file's matrices: q8_0 when any is, else f16 when any is, else f32.
	Type gguf.TensorType
}

// Read reads a LLaMA GGUF file: its config from the llama.* metadata, its tensors dequantised to float32 under
// their Hugging Face names (the q/k permutation undone), and its tokenizer. Anything the file lacks, a tensor of
// the wrong shape, or a name memfit does not know is an error naming it.
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
	arch, _, err := f.String("general.architecture")
	if err != nil {
		return nil, err
	}
	if arch != Arch {
		return nil, fmt.Errorf("general.architecture is %q: memfit reads GGUF files of the llama architecture", arch)
	}
	r := metaReader{f: f}
	cfg := decoder.Config{Task: decoder.CausalLM, Activation: decoder.ActSiLU, PadTokenID: -1, BOSTokenID: -1, EOSTokenID: -1}
	cfg.HiddenSize = r.int("llama.embedding_length", true, 0)
	cfg.NumHiddenLayers = r.int("llama.block_count", true, 0)
	cfg.IntermediateSize = r.int("llama.feed_forward_length", true, 0)
	cfg.NumAttentionHeads = r.int("llama.attention.head_count", true, 0)
	cfg.NumKeyValueHeads = r.int("llama.attention.head_count_kv", false, cfg.NumAttentionHeads)
	defHead := 0
	if cfg.NumAttentionHeads > 0 {
		defHead = cfg.HiddenSize / cfg.NumAttentionHeads
	}
	cfg.HeadDim = r.int("llama.attention.key_length", false, defHead)
	if v := r.int("llama.attention.value_length", false, cfg.HeadDim); v != cfg.HeadDim {
		return nil, fmt.Errorf("llama.attention.value_length %d differs from key_length %d: LLaMA uses one head size", v, cfg.HeadDim)
	}
	if rd := r.int("llama.rope.dimension_count", false, cfg.HeadDim); rd != cfg.HeadDim {
		return nil, fmt.Errorf("llama.rope.dimension_count %d is not the head size %d: memfit rotates the whole head", rd, cfg.HeadDim)
	}
	cfg.MaxPositionEmbeddings = r.int("llama.context_length", true, 0)
	cfg.RopeTheta = r.float("llama.rope.freq_base", 10000)
	cfg.RMSNormEps = r.float("llama.attention.layer_norm_rms_epsilon", 1e-5)
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 {
		return nil, fmt.Errorf("no token_embd.weight matrix")
	}
	cfg.VocabSize = r.int("llama.vocab_size", false, int(min(emb.Dims[1], math.MaxInt32)))
	if st, _, err := f.String("llama.rope.scaling.type"); err != nil {
		return nil, err
	} else if st == "linear" {
		cfg.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLinear, Factor: r.float("llama.rope.scaling.factor", 1)}
	} else if st != "" && st != "none" {
		return nil, fmt.Errorf("llama.rope.scaling.type %q is not supported (linear, or Llama-3.1's rope_freqs)", st)
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
	_, hasHead := f.Tensor("output.weight")
	cfg.TieWordEmbeddings = !hasHead
	_, cfg.AttentionBias = f.Tensor("blk.0.attn_q.bias")
	_, cfg.MLPBias = f.Tensor("blk.0.ffn_gate.bias")
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
		return nil, fmt.Errorf("the llama.* metadata: %w", err)
	}
	shapes := decoder.Shapes(cfg)
	maps := mappings(cfg, func(name string) bool { _, ok := shapes[name]; return ok })
	known := map[string]mapping{"rope_freqs.weight": {}}
	for _, m := range maps {
		known[m.gguf] = m
	}
	params := models.Params{}
	typ := gguf.F32
	for _, ti := range f.Tensors {
		m, ok := known[ti.Name]
		if !ok {
			return nil, fmt.Errorf("tensor %s is not one of a LLaMA of this config", ti.Name)
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
		params[m.hf] = tensors.FromFlatDataAndDimensions(x, want...)
	}
	if err := models.CheckShapes(params, shapes); err != nil {
		return nil, err
	}
	return &Model{Config: cfg, Params: params, Tokenizer: tok, Type: typ}, nil
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
