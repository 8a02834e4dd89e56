// Package ia3 is an example adapter written only against memfit's public API (package adapter): PEFT's (IA)³
// (https://arxiv.org/abs/2205.05638), a learned vector l that rescales a layer, starting at ones. On most layers
// it scales the output,
//
//	y = (W x + b) ∘ l,    l saved as "<path>.ia3_l" with shape [out, 1],
//
// and on the feedforward layers (PEFT's feedforward_modules: the MLP's down projection, as in the paper) it
// scales the input,
//
//	y = W (x ∘ l) + b,    l with shape [1, in].
//
// Importing the package registers its format (init), so finetune.ReadAdapter reads PEFT IA3 adapters:
//
//	import _ "github.com/memfit/memfit/examples/ia3"
//
// Output scaling does not depend on the input basis, so it exports and imports under MS-norm. Input scaling
// commutes with a norm's scale g but not with its shift beta: on a layer folded from a LayerNorm with a bias it
// exports merged only.
package ia3

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
)

// Suffix is the PEFT key suffix of the vector l: "base_model.model.<path>.ia3_l".
const Suffix = "ia3_l"

// Config are (IA)³'s settings: which adapted layers are feedforward (scaled on their input). Set at most one of
// the two fields; with neither, every layer scales its output.
type Config struct {
	// FeedForward are module names in PEFT's list form: a layer is feedforward when its path ends with one of
	// them (PEFT's key.endswith), e.g. "mlp.down_proj" (LLaMA) or "layer.0.output.dense" (ViT, where
	// "output.dense" also ends "attention.output.dense").
	FeedForward []string
	// Pattern is PEFT's string form: a layer is feedforward when its whole path matches this regular expression
	// (Python's re.fullmatch). Only the syntax Go's regexp shares with Python's re is accepted.
	Pattern string
}

// Regexp returns the regular expression, matched against a whole path, that selects the feedforward layers:
// Pattern, or `.*(?:n1|n2|...)` for the names of FeedForward (the same as PEFT's endswith); "" when there are
// none.
func (c Config) Regexp() string {
	if c.Pattern != "" {
		return c.Pattern
	}
	if len(c.FeedForward) == 0 {
		return ""
	}
	quoted := make([]string, len(c.FeedForward))
	for i, n := range c.FeedForward {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return ".*(?:" + strings.Join(quoted, "|") + ")"
}

// Validate checks the settings and returns the compiled feedforward matcher (nil when there is none).
func (c Config) Validate() (*regexp.Regexp, error) {
	if c.Pattern != "" && len(c.FeedForward) > 0 {
		return nil, fmt.Errorf("IA3: set feedforward module names or a pattern, not both")
	}
	for _, n := range c.FeedForward {
		if n == "" {
			return nil, fmt.Errorf("IA3: empty feedforward module name in %q", c.FeedForward)
		}
	}
	expr := c.Regexp()
	if expr == "" {
		return nil, nil
	}
	re, err := regexp.Compile("^(?:" + expr + ")$")
	if err != nil {
		return nil, fmt.Errorf("IA3 feedforward_modules %q: %w", expr, err)
	}
	return re, nil
}

// IA3 is the adapter of one layer: FeedForward says whether it scales the layer's input (true) or output.
type IA3 struct {
	Config      Config
	FeedForward bool
}

// New returns a constructor for adapter.NewSet that gives every layer an IA3 adapter, scaling the input of the
// layers cfg names feedforward and the output of the others.
func New(cfg Config) (func(models.LinearLayer) adapter.Adapter, error) {
	re, err := cfg.Validate()
	if err != nil {
		return nil, err
	}
	return func(l models.LinearLayer) adapter.Adapter {
		return &IA3{Config: cfg, FeedForward: re != nil && re.MatchString(l.Path)}
	}, nil
}

// Type returns "IA3".
func (a *IA3) Type() string { return "IA3" }

// size returns the length of l and its PEFT shape: [1, in] on the input, [out, 1] on the output.
func (a *IA3) size(layer models.LinearLayer) (int, []int) {
	if a.FeedForward {
		return layer.In, []int{1, layer.In}
	}
	return layer.Out, []int{layer.Out, 1}
}

// Init returns l = ones (PEFT's init_ia3_weights), so the adapted layer starts as the base layer.
func (a *IA3) Init(layer models.LinearLayer, _ adapter.Base, _ *rand.Rand) (map[string]*tensors.Tensor, error) {
	n, dims := a.size(layer)
	if n <= 0 {
		return nil, fmt.Errorf("%s: layer has no features [%d, %d]", layer.Path, layer.Out, layer.In)
	}
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	return map[string]*tensors.Tensor{Suffix: tensors.FromFlatDataAndDimensions(ones, dims...)}, nil
}

// Trainable: l trains.
func (a *IA3) Trainable(suffix string) bool { return suffix == Suffix }

// Forward scales the output or the input (PEFT's ia3 Linear.forward). With g = dL/dy per token:
//
//	output, y = (W x + b) ∘ l:  dL/dl = Σ_tokens g ∘ (W x + b),   dL/dx = Wᵀ (g ∘ l)
//	input,  y = W (x ∘ l) + b:  dL/dl = Σ_tokens x ∘ (Wᵀ g),       dL/dx = l ∘ (Wᵀ g)
//
// so the step keeps the base output (output form) or the input x (input form), and l.
func (a *IA3) Forward(_ adapter.Context, layer models.LinearLayer, x, weight, bias *graph.Node, p map[string]*graph.Node) *graph.Node {
	l := p[Suffix]
	if l == nil {
		panic(fmt.Sprintf("ia3: layer %s is missing %s", layer.Path, Suffix))
	}
	n, _ := a.size(layer)
	if l.Shape().Size() != n {
		panic(fmt.Sprintf("ia3: %s.%s has shape %s, want %d values", layer.Path, Suffix, l.Shape(), n))
	}
	v := graph.Reshape(l, n)
	if v.DType() != x.DType() {
		v = graph.ConvertDType(v, x.DType())
	}
	if a.FeedForward {
		return engine.Linear(graph.Mul(x, graph.ExpandLeftToRank(v, x.Rank())), weight, bias)
	}
	y := engine.Linear(x, weight, bias)
	return graph.Mul(y, graph.ExpandLeftToRank(v, y.Rank()))
}

// vector returns l as float32, checked against the layer.
func (a *IA3) vector(layer models.LinearLayer, p models.Params) ([]float32, error) {
	l, err := p.Float32s(Suffix)
	if err != nil {
		return nil, err
	}
	if n, dims := a.size(layer); len(l) != n {
		return nil, fmt.Errorf("%s.%s has %d values, want %v", layer.Path, Suffix, len(l), dims)
	}
	return l, nil
}

// Merge returns the plain layer: W' = diag(l) W and b' = l ∘ b when scaling the output, W' = W diag(l) (b
// unchanged) when scaling the input (PEFT's merge: weight * ia3_l, broadcasting [out, 1] or [1, in]).
func (a *IA3) Merge(layer models.LinearLayer, base msnorm.Dense, p models.Params) (msnorm.Dense, error) {
	l, err := a.vector(layer, p)
	if err != nil {
		return msnorm.Dense{}, err
	}
	return a.scale(layer, base, l, func(w, s float32) float32 { return w * s })
}

// Unmerge divides where Merge multiplied: W = diag(1/l) W' and b = b' / l, or W = W' diag(1/l). A zero (or
// non-finite) l erased what it scaled and is refused.
func (a *IA3) Unmerge(layer models.LinearLayer, merged msnorm.Dense, p models.Params) (msnorm.Dense, error) {
	l, err := a.vector(layer, p)
	if err != nil {
		return msnorm.Dense{}, err
	}
	for i, v := range l {
		if v == 0 || math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return msnorm.Dense{}, fmt.Errorf("%s: cannot unmerge IA3: ia3_l[%d] is %g", layer.Path, i, v)
		}
	}
	return a.scale(layer, merged, l, func(w, s float32) float32 { return w / s })
}

// scale applies op(w, l) to W's rows (output) or columns (input), and to b when scaling the output.
func (a *IA3) scale(layer models.LinearLayer, d msnorm.Dense, l []float32, op func(w, s float32) float32) (msnorm.Dense, error) {
	if len(d.W) != layer.Out*layer.In || (d.B != nil && len(d.B) != layer.Out) {
		return msnorm.Dense{}, fmt.Errorf("%s: base layer has %d weights and %d biases, want [%d, %d] and [%d]",
			layer.Path, len(d.W), len(d.B), layer.Out, layer.In, layer.Out)
	}
	out := msnorm.Dense{Out: d.Out, In: d.In, W: make([]float32, len(d.W))}
	for o := 0; o < layer.Out; o++ {
		for i := 0; i < layer.In; i++ {
			var s float32
			if a.FeedForward {
				s = l[i] // column i: W diag(l)
			} else {
				s = l[o] // row o: diag(l) W
			}
			out.W[o*layer.In+i] = op(d.W[o*layer.In+i], s)
		}
	}
	if d.B != nil {
		out.B = append([]float32(nil), d.B...)
		if !a.FeedForward {
			for o := range out.B {
				out.B[o] = op(d.B[o], l[o])
			}
		}
	}
	return out, nil
}

// UnfoldInput moves l to the layer reading the norm's full output u = g ∘ z + beta. Output scaling does not see
// the input: l is unchanged. Input scaling on the folded layer computes, with W_z = W_u diag(g) and
// b_z = b_u + W_u beta (msnorm.Fold),
//
//	W_z (l ∘ z) + b_z = W_u diag(l) (g ∘ z) + b_z = W_u diag(l) (u - beta) + b_u + W_u beta
//	                  = W_u (l ∘ u) + b_u + W_u (1 - l) ∘ beta
//
// (diagonal maps commute): without a shift l is unchanged; with one the last term is a bias IA3 cannot hold, so
// it is refused (the merged export has no such limit).
func (a *IA3) UnfoldInput(layer models.LinearLayer, p models.Params, fold adapter.FoldedInput) (models.Params, error) {
	return a.sameBasis(layer, p, fold.Norm)
}

// FoldInput is UnfoldInput's inverse, with the same rule: l unchanged, refused for input scaling under a shift.
func (a *IA3) FoldInput(layer models.LinearLayer, p models.Params, fold adapter.FoldedInput) (models.Params, error) {
	return a.sameBasis(layer, p, fold.Norm)
}

func (a *IA3) sameBasis(layer models.LinearLayer, p models.Params, norm msnorm.NormAffine) (models.Params, error) {
	if a.FeedForward && norm.HasBeta() {
		return nil, fmt.Errorf("%s: IA3 scaling the input of a layer folded from a norm with a shift (LayerNorm's bias) has no PEFT equivalent in the original basis: export merged, or scale this layer's output", layer.Path)
	}
	out := models.Params{}
	for k, v := range p {
		out[k] = v
	}
	return out, nil
}

// PEFTConfig returns PEFT's IA3 fields. feedforward_modules is written in PEFT's string form (Config.Regexp)
// when there are feedforward layers: PEFT checks a list form against target_modules as a subset, and memfit's
// target_modules are full module paths, so a list of short names would be refused; the string form is matched in
// full against each module's path, with no such check. Without feedforward layers it is an empty list.
func (a *IA3) PEFTConfig([]string) map[string]any {
	var ff any = []string{}
	if re := a.Config.Regexp(); re != "" {
		ff = re
	}
	return map[string]any{adapter.KeyType: "IA3", "feedforward_modules": ff, "fan_in_fan_out": false, "init_ia3_weights": true}
}

// FromPEFT reads IA3's settings from a PEFT adapter_config.json: feedforward_modules as a list of names (matched
// as path endings) or a string (a regular expression matched against the whole path). fan_in_fan_out is
// refused.
func FromPEFT(c adapter.PEFTConfig) (Config, error) {
	if c.Type() != "IA3" {
		return Config{}, fmt.Errorf("peft_type is %q, want IA3", c.Type())
	}
	if err := c.Refuse("the IA3 example", "fan_in_fan_out"); err != nil {
		return Config{}, err
	}
	var cfg Config
	if s, ok := c["feedforward_modules"].(string); ok {
		cfg.Pattern = s
	} else {
		names, err := c.Strings("feedforward_modules")
		if err != nil {
			return Config{}, err
		}
		cfg.FeedForward = names
	}
	_, err := cfg.Validate()
	return cfg, err
}

// Format is IA3's import format (peft_type IA3). init registers it.
var Format = adapter.NewFormat("IA3", func(c adapter.PEFTConfig) bool { return c.Type() == "IA3" }, FromPEFT, New)

func init() { adapter.Register(Format) }
