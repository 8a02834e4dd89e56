package llamagguf

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// Model is a decoder read from a GGUF file.
type Model struct {
	// Arch is the file's general.architecture; ModelType the model_type memfit recorded ("" for a file memfit did
	// not write).
	Arch, ModelType string
	Config          decoder.Config
	Params          models.Params
	// Tokenizer is nil when the file has none (tokenizer.ggml.model "none").
	Tokenizer *tokenizer.Tokenizer
	// Type is the type of the file's matrices: q8_0 when any is, else f16 when any is, else f32.
	Type gguf.TensorType
}

// Read reads a GGUF file of one of the architectures of Archs: its config from the <arch>.* metadata (the
// switches of llama.cpp's graph of the architecture, and its defaults where the file is silent), its tensors
// dequantised to float32 under their Hugging Face names (the export's layouts undone), and its tokenizer.
// Anything the file lacks, a tensor of the wrong shape, or a name memfit does not know is an error naming it.
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
	a, err := archOf(name)
	if err != nil {
		return nil, err
	}
	r := metaReader{f: f}
	cfg := decoder.Config{Task: decoder.CausalLM, PadTokenID: -1, BOSTokenID: -1, EOSTokenID: -1}
	a.setSwitches(&cfg)
	cfg.HiddenSize = r.int(a.key("embedding_length"), true, 0)
	cfg.NumHiddenLayers = r.int(a.key("block_count"), true, 0)
	cfg.IntermediateSize = r.int(a.key("feed_forward_length"), true, 0)
	cfg.NumAttentionHeads = r.int(a.key("attention.head_count"), true, 0)
	cfg.NumKeyValueHeads = r.int(a.key("attention.head_count_kv"), false, cfg.NumAttentionHeads)
	defHead := 0
	if cfg.NumAttentionHeads > 0 {
		defHead = cfg.HiddenSize / cfg.NumAttentionHeads
	}
	cfg.HeadDim = r.int(a.key("attention.key_length"), false, defHead)
	if v := r.int(a.key("attention.value_length"), false, cfg.HeadDim); v != cfg.HeadDim && r.err == nil {
		return nil, fmt.Errorf("%s %d differs from key_length %d: memfit's decoder uses one head size", a.key("attention.value_length"), v, cfg.HeadDim)
	}
	if rd := r.int(a.key("rope.dimension_count"), false, cfg.HeadDim); rd != cfg.HeadDim && r.err == nil {
		if !a.partialRotary || rd <= 0 || rd > cfg.HeadDim {
			return nil, fmt.Errorf("%s %d is not the head size %d: memfit rotates the whole head in the %s architecture", a.key("rope.dimension_count"), rd, cfg.HeadDim, a.name)
		}
		cfg.PartialRotary = partialRotary(f, rd, cfg.HeadDim)
	}
	cfg.MaxPositionEmbeddings = r.int(a.key("context_length"), true, 0)
	cfg.RopeTheta = r.float(a.key("rope.freq_base"), 10000)
	cfg.RMSNormEps = r.float(a.key("attention.layer_norm_rms_epsilon"), 1e-5)
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 {
		return nil, fmt.Errorf("no token_embd.weight matrix")
	}
	cfg.VocabSize = r.int(a.key("vocab_size"), false, int(min(emb.Dims[1], math.MaxInt32)))
	if err := readRope(f, a, &r, &cfg); err != nil {
		return nil, err
	}
	if a.localRope {
		cfg.LocalRopeTheta = r.float(a.key("rope.freq_base_swa"), 10000) // llama.cpp's default
	}
	readSliding(f, a, &r, &cfg)
	capOf := func(mode capMode, key, memfitKey string, def float64) float64 {
		if v, ok, _ := f.Float(memfitKey); ok && v == 0 {
			return 0
		}
		v := 0.0
		switch mode {
		case capAlways:
			v = r.float(a.key(key), def)
		case capOptional:
			v = r.float(a.key(key), 0)
		}
		if v >= noCap {
			return 0 // the export's stand-in for no cap (an identity in float32), read as none
		}
		return v
	}
	cfg.AttnSoftCap = capOf(a.attnCap, "attn_logit_softcapping", keyAttnCap, a.attnCapDef)
	cfg.FinalSoftCap = capOf(a.finalCap, "final_logit_softcapping", keyFinalCap, a.finalCapDef)
	if a.fixedScale {
		cfg.QueryPreAttnScalar = r.float(keyQueryScalar, a.scoreScalar(cfg))
	}
	_, hasHead := f.Tensor("output.weight")
	cfg.TieWordEmbeddings = !hasHead
	_, qBias := f.Tensor("blk.0.attn_q.bias")
	if _, ok := f.Tensor("blk.0.attn_qkv.bias"); ok {
		qBias = true
	}
	_, oBias := f.Tensor("blk.0.attn_output.bias")
	cfg.AttentionBias = oBias
	cfg.QKVBias = qBias && !oBias
	_, cfg.MLPBias = f.Tensor("blk.0.ffn_down.bias")
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
		return nil, fmt.Errorf("the %s.* metadata: %w", a.name, err)
	}
	shapes := decoder.Shapes(cfg)
	maps := mappings(a, cfg, func(name string) bool { _, ok := shapes[name]; return ok })
	known := map[string]mapping{"rope_freqs.weight": {}, "rope_factors_long.weight": {}, "rope_factors_short.weight": {}}
	for _, m := range maps {
		known[m.gguf] = m
	}
	params := models.Params{}
	typ := gguf.F32
	for _, ti := range f.Tensors {
		m, ok := known[ti.Name]
		if !ok {
			return nil, fmt.Errorf("tensor %s is not one of a %s model of this config", ti.Name, a.name)
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
		cols := 1
		if len(want) == 2 {
			cols = want[1]
		}
		params[m.hf] = tensors.FromFlatDataAndDimensions(m.load(x, cols), want...)
	}
	if err := models.CheckShapes(params, shapes); err != nil {
		return nil, err
	}
	return &Model{Arch: a.name, ModelType: ModelType(f), Config: cfg, Params: params, Tokenizer: tok, Type: typ}, nil
}

// partialRotary returns partial_rotary_factor: memfit's recorded value when it gives rd of headDim's dimensions,
// else the share rd/headDim (nudged up when float rounding would make int(headDim * share) one less).
func partialRotary(f *gguf.File, rd, headDim int) float64 {
	if p, ok, _ := f.Float(keyPartialRotary); ok && int(float64(headDim)*p) == rd {
		return p
	}
	p := float64(rd) / float64(headDim)
	for int(float64(headDim)*p) < rd {
		p = math.Nextafter(p, 2)
	}
	return p
}

// readRope reads the rope scaling: linear (rope.scaling.type, factor), Llama 3.1's (rope_freqs), or LongRoPE
// (rope_factors_long/short, rope.scaling.attn_factor and original_context_length).
func readRope(f *gguf.File, a arch, r *metaReader, cfg *decoder.Config) error {
	if st, _, err := f.String(a.key("rope.scaling.type")); err != nil {
		return err
	} else if st == "linear" {
		if factor := r.float(a.key("rope.scaling.factor"), 0); factor != 0 && factor != 1 {
			cfg.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLinear, Factor: factor}
		}
	} else if st != "" && st != "none" && !(st == "longrope" && a.longRope) {
		return fmt.Errorf("%s %q is not supported (linear, Llama-3.1's rope_freqs, or Phi-3's LongRoPE factors)", a.key("rope.scaling.type"), st)
	}
	if r.err != nil {
		return r.err
	}
	half := cfg.RotaryDim() / 2
	vector := func(name string) ([]float32, bool, error) {
		ti, ok := f.Tensor(name)
		if !ok {
			return nil, false, nil
		}
		if len(ti.Dims) != 1 || ti.Dims[0] != uint64(half) {
			return nil, true, fmt.Errorf("%s has dimensions %v, want [%d] (the rotary dimensions / 2)", name, ti.Dims, half)
		}
		x, err := f.Float32s(name)
		return x, true, err
	}
	freqs, ok, err := vector("rope_freqs.weight")
	if err != nil {
		return err
	}
	if ok {
		if !a.llama3Rope {
			return fmt.Errorf("rope_freqs.weight: memfit reads Llama-3.1 rope factors in the llama architecture only, not %s", a.name)
		}
		if _, ok := f.Value(keyL3Factor); ok {
			cfg.RopeScaling = &decoder.RopeScaling{Type: decoder.RopeLlama3, Factor: r.float(keyL3Factor, 0), LowFreqFactor: r.float(keyL3Low, 0),
				HighFreqFactor: r.float(keyL3High, 0), OriginalMaxPositionEmbeddings: r.int(keyL3Original, true, 0)}
			if r.err == nil && !ropeFactorsMatch(*cfg, cfg.RopeScaling, freqs) {
				return fmt.Errorf("rope_freqs.weight disagrees with the %s settings in the metadata", "memfit.rope_scaling.llama3")
			}
		} else if cfg.RopeScaling, err = inferLlama3(*cfg, freqs); err != nil {
			return err
		}
		return r.err
	}
	long, hasLong, err := vector("rope_factors_long.weight")
	if err != nil {
		return err
	}
	short, hasShort, err := vector("rope_factors_short.weight")
	if err != nil {
		return err
	}
	if hasLong != hasShort {
		return fmt.Errorf("rope_factors_long.weight and rope_factors_short.weight go together: the file has one")
	}
	if !hasLong {
		return nil
	}
	if !a.longRope {
		return fmt.Errorf("rope_factors_long.weight: memfit reads LongRoPE factors in the phi3 architecture only, not %s", a.name)
	}
	orig := r.int(a.key("rope.scaling.original_context_length"), false, cfg.MaxPositionEmbeddings)
	s := &decoder.RopeScaling{Type: decoder.RopeLongRope, ShortFactor: toF64(short), LongFactor: toF64(long), OriginalMaxPositionEmbeddings: orig,
		AttentionFactor: r.float(a.key("rope.scaling.attn_factor"), 1)} // llama.cpp's default: cos and sin unscaled
	if orig > 0 {
		s.Factor = float64(cfg.MaxPositionEmbeddings) / float64(orig)
	}
	// The attention factor transformers computes from the factor when the config gives none, left to it again.
	def := *s
	def.AttentionFactor = 0
	plain := *cfg
	plain.RopeScaling = &def
	if orig > 0 && plain.RopeFor(false, 0).Scale == float32(s.AttentionFactor) {
		s.AttentionFactor = 0
	}
	cfg.RopeScaling = s
	return r.err
}

func toF64(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		// The shortest decimal that reads back to the float32, as the config.json the factors came from says it.
		out[i], _ = strconv.ParseFloat(strconv.FormatFloat(float64(v), 'g', -1, 32), 64)
	}
	return out
}

// readSliding reads the sliding window and which layers take it: attention.sliding_window_pattern as flags per
// layer, or as llama.cpp's period n (set_swa_pattern: layer i slides when i % n < n-1, every layer when n is 0),
// else the architecture's default period (every layer for the architectures without one: Mistral, Phi-3).
func readSliding(f *gguf.File, a arch, r *metaReader, cfg *decoder.Config) {
	key := a.key("attention.sliding_window")
	if _, ok := f.Value(key); !ok && !a.swaAlways {
		return // no sliding layers (gemma2 slides even without the key: llama.cpp's defaults)
	}
	window := r.int(key, false, a.defaultWindow)
	if window <= 0 {
		return
	}
	layers := make([]bool, cfg.NumHiddenLayers)
	pkey := a.key("attention.sliding_window_pattern")
	var flags []bool
	switch p, _ := f.Value(pkey); p := p.(type) {
	case []bool:
		flags = p
	case []uint32:
		for _, v := range p {
			flags = append(flags, v != 0)
		}
	case []int32:
		for _, v := range p {
			flags = append(flags, v != 0)
		}
	}
	if flags != nil {
		if len(flags) != len(layers) {
			r.fail(fmt.Errorf("%s lists %d layers, the model has %d", pkey, len(flags), len(layers)))
			return
		}
		copy(layers, flags)
	} else {
		period := r.int(pkey, false, a.defaultPattern)
		for i := range layers {
			layers[i] = period == 0 || i%period < period-1
		}
	}
	if slices.Contains(layers, true) {
		cfg.SlidingWindow, cfg.Sliding = window, layers
	}
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

func (r *metaReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}
