// Package lora is memfit's LoRA and LoRA-FA adapter: an adapter.Adapter with PEFT's tensors, initialisation,
// merge and adapter_config.json, registered for import as the format of PEFT adapters with peft_type LORA.
package lora

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
)

// Config are LoRA's settings.
type Config struct {
	// Rank r of the update B·A.
	Rank int
	// Alpha scales the update by Alpha/Rank (Alpha/sqrt(Rank) with RSLoRA).
	Alpha float64
	// RSLoRA uses the rank-stabilised scaling Alpha/sqrt(Rank).
	RSLoRA bool
	// FrozenA makes it LoRA-FA: A keeps its random initialisation and only B trains, so the backward keeps
	// only A·x (rank r per token) instead of x.
	FrozenA bool
	// Dropout is the probability of zeroing an input of the adapter branch in training steps (PEFT's
	// lora_dropout). The dropped-out input is a new tensor that A's gradient keeps, so dropout costs one
	// activation per adapted layer (and the sharing with an MS-norm output).
	Dropout float64
	// Bias gives B a bias b_B [out] (PEFT's lora_bias), initialised to zero. Adapters exported under MS-norm
	// after a LayerNorm get one from the change of basis whatever this says.
	Bias bool
	// RankPattern and AlphaPattern are PEFT's rank_pattern and alpha_pattern: a layer whose module path matches
	// an entry's key (a name or regular expression, the first match in order: adapter.MatchPattern) takes its
	// value as rank (alpha) instead of Rank (Alpha). ForLayer resolves them for one layer.
	RankPattern  []adapter.Pattern
	AlphaPattern []adapter.Pattern

	// shared is the config ForLayer resolved this one from: what adapter_config.json states for every layer.
	shared *Config
}

// ForLayer returns the settings of the layer at path: Rank and Alpha from the first RankPattern and AlphaPattern
// entries that match it, the rest as in c. The result keeps c (Shared) for the adapter_config.json that every
// layer of a run writes alike.
func (c Config) ForLayer(path string) Config {
	shared := c.Shared()
	out := shared
	if r, ok := adapter.MatchPattern(shared.RankPattern, path); ok {
		out.Rank = int(r)
	}
	if a, ok := adapter.MatchPattern(shared.AlphaPattern, path); ok {
		out.Alpha = a
	}
	out.shared = &shared
	return out
}

// Shared returns the run-wide settings a ForLayer result was resolved from (c itself otherwise).
func (c Config) Shared() Config {
	if c.shared != nil {
		return *c.shared
	}
	return c
}

// Validate checks the settings.
func (c Config) Validate() error {
	if c.Rank <= 0 {
		return fmt.Errorf("LoRA rank must be positive, got %d", c.Rank)
	}
	if c.Alpha <= 0 || math.IsNaN(c.Alpha) || math.IsInf(c.Alpha, 0) {
		return fmt.Errorf("LoRA alpha must be positive, got %g", c.Alpha)
	}
	if c.Dropout < 0 || c.Dropout >= 1 || math.IsNaN(c.Dropout) {
		return fmt.Errorf("LoRA dropout must be in [0, 1), got %g", c.Dropout)
	}
	for _, p := range c.RankPattern {
		if p.Value <= 0 || p.Value != math.Trunc(p.Value) || p.Value > 1<<24 {
			return fmt.Errorf("rank_pattern[%q] is %g, want a positive integer rank", p.Key, p.Value)
		}
	}
	for _, p := range c.AlphaPattern {
		if !(p.Value > 0) || math.IsInf(p.Value, 0) {
			return fmt.Errorf("alpha_pattern[%q] is %g, want a positive alpha", p.Key, p.Value)
		}
	}
	return nil
}

// Scale returns the factor applied to B·A·x.
func (c Config) Scale() float64 {
	if c.RSLoRA {
		return c.Alpha / math.Sqrt(float64(c.Rank))
	}
	return c.Alpha / float64(c.Rank)
}

// LoRA is the low-rank adapter y = W x + b + scale · B (A x), A [r, in], B [out, r].
type LoRA struct{ Config Config }

// New returns a constructor for NewSet that gives every layer a LoRA adapter with cfg (its rank and alpha for
// that layer: Config.ForLayer).
func New(cfg Config) (func(models.LinearLayer) adapter.Adapter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return func(l models.LinearLayer) adapter.Adapter { return &LoRA{Config: cfg.ForLayer(l.Path)} }, nil
}

// PEFT key suffixes of the two LoRA matrices, and of the optional bias of B (PEFT's lora_bias).
const (
	SuffixA     = "lora_A.weight"
	SuffixB     = "lora_B.weight"
	SuffixBBias = "lora_B.bias"
)

// Type returns "LORA".
func (l *LoRA) Type() string { return "LORA" }

// Init initialises as PEFT does: A Kaiming-uniform with a = sqrt(5) (uniform in ±1/sqrt(in)), B (and its bias
// with Config.Bias) zero, so the adapted layer starts equal to the base layer.
func (l *LoRA) Init(layer models.LinearLayer, _ adapter.Base, r *rand.Rand) (map[string]*tensors.Tensor, error) {
	rank := l.Config.Rank
	if rank > min(layer.In, layer.Out) {
		return nil, fmt.Errorf("LoRA rank %d exceeds the layer's size [%d, %d]", rank, layer.Out, layer.In)
	}
	bound := 1 / math.Sqrt(float64(layer.In))
	a := make([]float32, rank*layer.In)
	for i := range a {
		a[i] = float32((2*r.Float64() - 1) * bound)
	}
	out := map[string]*tensors.Tensor{
		SuffixA: tensors.FromFlatDataAndDimensions(a, rank, layer.In),
		SuffixB: tensors.FromFlatDataAndDimensions(make([]float32, layer.Out*rank), layer.Out, rank),
	}
	if l.Config.Bias {
		out[SuffixBBias] = tensors.FromFlatDataAndDimensions(make([]float32, layer.Out), layer.Out)
	}
	return out, nil
}

// Trainable: B (and its bias, when present) always, A unless LoRA-FA.
func (l *LoRA) Trainable(suffix string) bool {
	return suffix == SuffixB || suffix == SuffixBBias || (suffix == SuffixA && !l.Config.FrozenA)
}

// Forward returns W x + b + scale · (B (A x) + b_B), b_B being present only for adapters imported or exported
// with PEFT's lora_bias. Backward (through engine.Linear's matmul gradients): the base matmul keeps x only if W
// is trained; A's gradient needs x (shared with a memory-sharing norm's output when the layer follows one); B's
// gradient needs A x (rank r per token). With LoRA-FA, A is frozen and only A x is kept.
func (l *LoRA) Forward(ctx adapter.Context, layer models.LinearLayer, x, weight, bias *graph.Node, p map[string]*graph.Node) *graph.Node {
	a, b := p[SuffixA], p[SuffixB]
	if a == nil || b == nil {
		panic(fmt.Sprintf("lora: layer %s is missing %s or %s", layer.Path, SuffixA, SuffixB))
	}
	base := engine.Linear(x, weight, bias)
	in := x
	if ctx.Training && ctx.RNG != nil && l.Config.Dropout > 0 {
		in = engine.Dropout(ctx.RNG, x, l.Config.Dropout)
	}
	// The scale multiplies A x, [tokens, r] (and B's bias), rather than the [tokens, out] update: a pass over r
	// columns instead of out (the pure-Go backend runs every elementwise op as a pass of its own). B's gradient
	// keeps the scaled A x instead of A x, the same bytes.
	scale := l.Config.Scale()
	bb := p[SuffixBBias]
	if bb != nil {
		bb = graph.MulScalar(bb, scale)
	}
	update := engine.Linear(graph.MulScalar(engine.Linear(in, a, nil), scale), b, bb)
	return graph.Add(base, update)
}

// matrices returns A [r, in], B [out, r] and b_B ([out] or nil) from params.
func (l *LoRA) matrices(layer models.LinearLayer, p models.Params) (a, b, bb []float32, rank int, err error) {
	if a, err = p.Float32s(SuffixA); err != nil {
		return
	}
	if b, err = p.Float32s(SuffixB); err != nil {
		return
	}
	if _, ok := p[SuffixBBias]; ok {
		if bb, err = p.Float32s(SuffixBBias); err != nil {
			return
		}
	}
	rank = len(a) / max(layer.In, 1)
	if len(a) != rank*layer.In || len(b) != layer.Out*rank || (bb != nil && len(bb) != layer.Out) {
		err = fmt.Errorf("LoRA tensors of %s have %d, %d values, want [r, %d] and [%d, r]", layer.Path, len(a), len(b), layer.In, layer.Out)
	}
	return
}

// DeltaWeight returns s B A [out, in] in float64 for A [rank, in] and B [out, rank] (PEFT's get_delta_weight),
// for LoRA's merge and the adapters built on it (DoRA's W + s B A).
func DeltaWeight(a, b []float32, out, in, rank int, scale float64) []float64 {
	d := make([]float64, out*in)
	for o := 0; o < out; o++ {
		row := d[o*in : (o+1)*in]
		for k := 0; k < rank; k++ {
			bk := scale * float64(b[o*rank+k])
			if bk == 0 {
				continue
			}
			for i, av := range a[k*in : (k+1)*in] {
				row[i] += bk * float64(av)
			}
		}
	}
	return d
}

// delta returns s (B A) [out, in] in float64, and s b_B (nil without it): PEFT's get_delta_weight.
func (l *LoRA) delta(layer models.LinearLayer, p models.Params) ([]float64, []float64, error) {
	a, b, bb, rank, err := l.matrices(layer, p)
	if err != nil {
		return nil, nil, err
	}
	scale := l.Config.Scale()
	d := DeltaWeight(a, b, layer.Out, layer.In, rank, scale)
	var db []float64
	if bb != nil {
		db = make([]float64, layer.Out)
		for o, v := range bb {
			db[o] = scale * float64(v)
		}
	}
	return d, db, nil
}

// Merge returns W + s B A and b + s b_B.
func (l *LoRA) Merge(layer models.LinearLayer, base msnorm.Dense, p models.Params) (msnorm.Dense, error) {
	return l.addDelta(layer, base, p, 1)
}

// Unmerge returns W - s B A and b - s b_B.
func (l *LoRA) Unmerge(layer models.LinearLayer, merged msnorm.Dense, p models.Params) (msnorm.Dense, error) {
	return l.addDelta(layer, merged, p, -1)
}

func (l *LoRA) addDelta(layer models.LinearLayer, d msnorm.Dense, p models.Params, sign float64) (msnorm.Dense, error) {
	dw, db, err := l.delta(layer, p)
	if err != nil {
		return msnorm.Dense{}, err
	}
	if len(d.W) != len(dw) {
		return msnorm.Dense{}, fmt.Errorf("%s: base weight has %d values, want [%d, %d]", layer.Path, len(d.W), layer.Out, layer.In)
	}
	out := msnorm.Dense{Out: d.Out, In: d.In, W: make([]float32, len(d.W))}
	for i, w := range d.W {
		out.W[i] = float32(float64(w) + sign*dw[i])
	}
	out.B = msnorm.AddOffset(d.B, db, sign, layer.Out)
	return out, nil
}

// UnfoldInput moves the adapter to the layer's original input u (msnorm's change of basis with M = A): the
// branch computes s (B (A z) + b_B) = s (B A_u u - B A_u beta + b_B), so A becomes A_u = A diag(1/g) and b_B
// becomes b_B - B (A_u beta). The bias appears only under a norm with a shift (LayerNorm); it is exported as
// PEFT's lora_B.bias (lora_bias).
func (l *LoRA) UnfoldInput(layer models.LinearLayer, p models.Params, fold adapter.FoldedInput) (models.Params, error) {
	return l.rebase(layer, p, fold.Norm.InputToOriginal, -1)
}

// FoldInput moves the adapter from the original input u to the folded z: A = A_u diag(g), b_B + B (A_u beta).
func (l *LoRA) FoldInput(layer models.LinearLayer, p models.Params, fold adapter.FoldedInput) (models.Params, error) {
	return l.rebase(layer, p, fold.Norm.InputToFolded, 1)
}

func (l *LoRA) rebase(layer models.LinearLayer, p models.Params, change func([]float32, int) ([]float32, []float64, error), sign float64) (models.Params, error) {
	a, b, bb, rank, err := l.matrices(layer, p)
	if err != nil {
		return nil, err
	}
	a2, offset, err := change(a, rank)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", layer.Path, err)
	}
	out := models.Params{}
	for k, v := range p {
		out[k] = v
	}
	out[SuffixA] = tensors.FromFlatDataAndDimensions(a2, rank, layer.In)
	if offset != nil {
		// B's image of the offset: (B o)[out] lands in b_B.
		bo := make([]float64, layer.Out)
		for o := range bo {
			for k := 0; k < rank; k++ {
				bo[o] += float64(b[o*rank+k]) * offset[k]
			}
		}
		out[SuffixBBias] = tensors.FromFlatDataAndDimensions(msnorm.AddOffset(bb, bo, sign, layer.Out), layer.Out)
	}
	return out, nil
}

// PEFTConfig returns PEFT's adapter_config.json LoRA fields (the run's, Config.Shared: r, lora_alpha and the
// patterns, alike for every layer); lora_bias is set when a lora_B.bias is exported. LoRA-FA is saved as plain
// LoRA (its frozen A is part of the adapter).
func (l *LoRA) PEFTConfig(suffixes []string) map[string]any {
	out := l.Config.PEFTFields()
	out[adapter.KeyType], out["use_dora"] = "LORA", false
	out["lora_bias"] = slices.Contains(suffixes, SuffixBBias)
	return out
}

// PEFTFields returns the LoRA settings of adapter_config.json for the run-wide config (c.Shared()): r,
// lora_alpha, use_rslora, lora_dropout, rank_pattern, alpha_pattern, and PEFT's fan_in_fan_out false,
// init_lora_weights true, bias "none" (LoRA and the adapters built on its settings, such as DoRA, write them).
func (c Config) PEFTFields() map[string]any {
	s := c.Shared()
	return map[string]any{"r": s.Rank, "lora_alpha": s.Alpha, "use_rslora": s.RSLoRA, "lora_dropout": s.Dropout,
		"rank_pattern": adapter.PatternsJSON(s.RankPattern), "alpha_pattern": adapter.PatternsJSON(s.AlphaPattern),
		"fan_in_fan_out": false, "init_lora_weights": true, "bias": "none"}
}

// FromPEFT reads LoRA's settings from a PEFT adapter_config.json (peft_type LORA without DoRA): ReadSettings,
// with use_dora refused by name (examples/dora reads DoRA adapters).
func FromPEFT(c adapter.PEFTConfig) (Config, error) {
	if c.Type() != "LORA" {
		return Config{}, fmt.Errorf("peft_type is %q, want LORA", c.Type())
	}
	if err := c.Refuse("memfit's LoRA (see examples/dora)", "use_dora"); err != nil {
		return Config{}, err
	}
	return ReadSettings(c)
}

// PEFT's LoraConfig fields (PEFT 0.20) and what memfit does with each, for ReadSettings.
var (
	// peftCommon are the keys of every PEFT config: metadata, and the layer choice that finetune.ReadAdapter
	// honours for every format (adapter.Targeting, modules_to_save).
	peftCommon = []string{adapter.KeyType, adapter.KeyTaskType, adapter.KeyBaseModel, "revision", "inference_mode",
		"auto_mapping", "peft_version", adapter.KeyTargets, "exclude_modules", "layers_to_transform", "layers_pattern",
		adapter.KeyModulesToSave}
	// loraHonoured are read here: rank, alpha, rsLoRA, dropout, the per-layer patterns, lora_bias, and use_dora
	// (which chooses the format).
	loraHonoured = []string{"r", "lora_alpha", "use_rslora", "lora_dropout", "rank_pattern", "alpha_pattern",
		"lora_bias", "use_dora", "init_lora_weights", "fan_in_fan_out", "bias"}
	// loraInert change nothing an adapter file computes: settings of training-time initialisation that leave the
	// base weights as they are (eva_config), of the backward pass only (velora_config), of the Megatron module
	// name when megatron_config is off (megatron_core), of QALoRA when it is off (qalora_group_size), and
	// runtime_config (PEFT does not save it).
	loraInert = []string{"eva_config", "velora_config", "megatron_core", "qalora_group_size", "runtime_config"}
	// loraRefused change what the adapter computes, or belong to a base model PEFT changed, in ways memfit does
	// not implement: refused by name when set.
	loraRefused = []string{"megatron_config", "trainable_token_indices", "loftq_config", "corda_config", "lora_ga_config",
		"alora_invocation_tokens", "use_qalora", "monteclora_config", "layer_replication", "target_parameters",
		"use_bdlora", "arrow_config", "ensure_weight_tying"}
	// loraRefusedWhy says why each refused key is refused.
	loraRefusedWhy = map[string]string{
		"megatron_config":         "Megatron's parallel layers are not memfit's",
		"trainable_token_indices": "the adapter trains embedding rows (trainable tokens), which memfit does not load",
		"loftq_config":            "LoftQ initialisation changes the base weights this adapter belongs to",
		"corda_config":            "CorDA initialisation changes the base weights this adapter belongs to",
		"lora_ga_config":          "LoRA-GA initialisation changes the base weights this adapter belongs to",
		"alora_invocation_tokens": "activated LoRA applies the adapter only after its invocation tokens",
		"use_qalora":              "QALoRA pools the adapter's input",
		"monteclora_config":       "MonteCLoRA samples the adapter",
		"layer_replication":       "the adapter belongs to a model with replicated layers",
		"target_parameters":       "the adapter targets parameters (nn.Parameter), not linear layers",
		"use_bdlora":              "BD-LoRA's block-diagonal factors are not memfit's",
		"arrow_config":            "Arrow routes among several adapters",
		"ensure_weight_tying":     "memfit does not tie adapters across tied weights",
	}
	// initChangesBase are init_lora_weights values whose initialisation subtracts the adapter's start from the
	// base weights: the adapter then belongs to those changed weights, not to the model it is loaded on.
	initChangesBase = []string{"pissa", "olora", "corda", "loftq", "lora_ga"}
	// initHonoured are the init_lora_weights values that leave the base weights as they are.
	initHonoured = []string{"gaussian", "eva", "orthogonal", "mica"}
)

// isSet reports whether a config value is set to something other than PEFT's "off" (null, false, "", 0, an empty
// list or object).
func isSet(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	case float64:
		return x != 0
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	case adapter.Ordered:
		return len(x) > 0
	}
	return true
}

// ReadSettings reads the LoRA settings of a PEFT LoRA config for LoRA and the adapters built on its settings
// (DoRA): r, lora_alpha, use_rslora, lora_dropout (with PEFT's defaults), rank_pattern and alpha_pattern, and
// lora_bias. It checks every other key against PEFT's LoraConfig: metadata and the layer choice (honoured by
// finetune.ReadAdapter), settings that change nothing an adapter file computes, and the rest, each refused by
// name when set (fan_in_fan_out, a bias other than "none", an init_lora_weights that changed the base weights,
// LoftQ, Megatron, trainable tokens, ...); a key PEFT does not define is refused too, unless it is off. It does
// not look at peft_type or use_dora.
func ReadSettings(c adapter.PEFTConfig) (Config, error) {
	var cfg Config
	var err error
	bad := func(e error) (Config, error) { return Config{}, e }
	for _, key := range slices.Sorted(maps.Keys(c)) {
		v := c[key]
		switch {
		case slices.Contains(peftCommon, key), slices.Contains(loraHonoured, key), slices.Contains(loraInert, key):
		case slices.Contains(loraRefused, key):
			if isSet(v) {
				return bad(fmt.Errorf("%s is set (%v): %s; memfit refuses this adapter rather than load it wrongly", key, v, loraRefusedWhy[key]))
			}
		default:
			if isSet(v) {
				return bad(fmt.Errorf("%s is %v, a setting memfit does not know (not one of PEFT's LoraConfig fields): refusing the adapter rather than ignoring it", key, v))
			}
		}
	}
	if err := c.Refuse("memfit (weights are [out, in])", "fan_in_fan_out"); err != nil {
		return bad(err)
	}
	switch b := c["bias"].(type) {
	case nil:
	case string:
		if b != "none" {
			return bad(fmt.Errorf("bias is %q: memfit imports adapters with bias \"none\" (PEFT's trained base biases are not loaded)", b))
		}
	default:
		return bad(fmt.Errorf("bias is %v, want \"none\"", b))
	}
	switch init := c["init_lora_weights"].(type) {
	case nil, bool:
	case string:
		for _, p := range initChangesBase {
			if strings.HasPrefix(strings.ToLower(init), p) {
				return bad(fmt.Errorf("init_lora_weights is %q: that initialisation changes the base weights, so the adapter belongs to PEFT's changed model, not to this one (convert it to a plain LoRA with PEFT's path_initial_model_for_weight_conversion)", init))
			}
		}
		if !slices.Contains(initHonoured, strings.ToLower(init)) {
			return bad(fmt.Errorf("init_lora_weights is %q, an initialisation memfit does not know", init))
		}
	default:
		return bad(fmt.Errorf("init_lora_weights is %v, want true, false or a PEFT initialisation name", init))
	}
	if cfg.Rank, err = c.Int("r", 8); err != nil {
		return bad(err)
	}
	if cfg.Alpha, err = c.Float("lora_alpha", 8); err != nil { // PEFT's defaults
		return bad(err)
	}
	if cfg.RSLoRA, err = c.Bool("use_rslora"); err != nil {
		return bad(err)
	}
	if cfg.Dropout, err = c.Float("lora_dropout", 0); err != nil {
		return bad(err)
	}
	if cfg.Bias, err = c.Bool("lora_bias"); err != nil {
		return bad(err)
	}
	if cfg.RankPattern, err = c.Patterns("rank_pattern"); err != nil {
		return bad(err)
	}
	if cfg.AlphaPattern, err = c.Patterns("alpha_pattern"); err != nil {
		return bad(err)
	}
	return cfg, cfg.Validate()
}

// Format is LoRA's import format: PEFT configs with peft_type LORA and no DoRA. init registers it.
var Format = func() adapter.Format {
	f := adapter.NewFormat("LoRA", func(c adapter.PEFTConfig) bool {
		dora, _ := c.Bool("use_dora")
		return c.Type() == "LORA" && !dora
	}, FromPEFT, New)
	f.Selector = "peft_type LORA, use_dora false"
	return f
}()

func init() { adapter.Register(Format) }
