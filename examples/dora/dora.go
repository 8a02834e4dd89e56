// Package dora is an example adapter written only against memfit's public API (package adapter): PEFT's DoRA,
// weight-decomposed low-rank adaptation (https://arxiv.org/abs/2402.09353), which PEFT saves as a LoRA adapter
// with use_dora true. The adapted layer is
//
//	y = (m / n) ∘ (W x + s B A x) + b,    n = ||W + s B A||_row (each output row's L2 norm),
//
// with A [r, in], B [out, r] and the scale s of LoRA (lora.Config), and a trained magnitude m [out] that starts
// at n (B = 0 at init, so the layer starts as the base layer). As PEFT does (section 4.3 of the paper), n is
// treated as a constant in the backward: it follows B and A in the forward but takes no gradient.
//
// Importing the package registers its format (init), so finetune.ReadAdapter reads PEFT DoRA adapters:
//
//	import _ "github.com/memfit/memfit/examples/dora"
//
// Under MS-norm, DoRA moves between the folded and the original basis exactly when the norms have no shift
// (RMSNorm: A as LoRA's, the magnitude by the ratio of the row norms, see UnfoldInput); after a LayerNorm with a
// shift it exports merged only (Trainer.ExportMerged), and its PEFT export and import refuse.
package dora

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
)

// SuffixMagnitude is the PEFT key suffix of the magnitude m [out]: PEFT saves it as
// "base_model.model.<path>.lora_magnitude_vector", without ".weight" (its LoraModel._get_adapter_state_dict strips
// the ".weight" of the DoraLinearLayer parameter, keeping the key of older PEFT versions). A and B keep LoRA's
// suffixes, lora.SuffixA and lora.SuffixB.
const SuffixMagnitude = "lora_magnitude_vector"

// DoRA is the adapter of one layer. Config holds LoRA's rank, alpha, RSLoRA and dropout; FrozenA is refused.
type DoRA struct{ Config lora.Config }

// New returns a constructor for adapter.NewSet that gives every layer a DoRA adapter with cfg (its rank and
// alpha for that layer from rank_pattern and alpha_pattern: lora.Config.ForLayer).
func New(cfg lora.Config) (func(models.LinearLayer) adapter.Adapter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.FrozenA {
		return nil, fmt.Errorf("DoRA trains A: LoRA-FA's frozen A is not part of PEFT's DoRA")
	}
	if cfg.Bias {
		return nil, fmt.Errorf("lora_bias is true: the DoRA example does not implement it")
	}
	return func(l models.LinearLayer) adapter.Adapter { return &DoRA{Config: cfg.ForLayer(l.Path)} }, nil
}

// Type returns "LORA": PEFT's peft_type for DoRA (use_dora in PEFTConfig tells it apart).
func (d *DoRA) Type() string { return "LORA" }

// Init initialises as PEFT does: A uniform in ±1/sqrt(in) (Kaiming uniform with a = sqrt(5)), B zero, and the
// magnitude m = ||W + s B A||_row = ||W||_row. It needs the base weights: it fails when base does.
func (d *DoRA) Init(layer models.LinearLayer, base adapter.Base, r *rand.Rand) (map[string]*tensors.Tensor, error) {
	rank := d.Config.Rank
	if rank > min(layer.In, layer.Out) {
		return nil, fmt.Errorf("DoRA rank %d exceeds the layer's size [%d, %d]", rank, layer.Out, layer.In)
	}
	w, err := base()
	if err != nil {
		return nil, fmt.Errorf("DoRA's magnitude starts at the base weight's row norms: %w", err)
	}
	if len(w.W) != layer.Out*layer.In {
		return nil, fmt.Errorf("%s: base weight has %d values, want [%d, %d]", layer.Path, len(w.W), layer.Out, layer.In)
	}
	bound := 1 / math.Sqrt(float64(layer.In))
	a := make([]float32, rank*layer.In)
	for i := range a {
		a[i] = float32((2*r.Float64() - 1) * bound)
	}
	m := make([]float32, layer.Out)
	for o := range m {
		s := 0.0
		for _, v := range w.W[o*layer.In : (o+1)*layer.In] {
			s += float64(v) * float64(v)
		}
		m[o] = float32(math.Sqrt(s))
	}
	return map[string]*tensors.Tensor{
		lora.SuffixA:    tensors.FromFlatDataAndDimensions(a, rank, layer.In),
		lora.SuffixB:    tensors.FromFlatDataAndDimensions(make([]float32, layer.Out*rank), layer.Out, rank),
		SuffixMagnitude: tensors.FromFlatDataAndDimensions(m, layer.Out),
	}, nil
}

// Trainable: A, B and the magnitude all train.
func (d *DoRA) Trainable(suffix string) bool {
	return suffix == lora.SuffixA || suffix == lora.SuffixB || suffix == SuffixMagnitude
}

// Forward returns the DoRA layer's output (PEFT's DoraLinearLayer.forward added to the base result).
//
// With f = m / n, n = ||W + s B A||_row held constant (graph.StopGradient, as PEFT's weight_norm.detach()):
//
//	y = W x + b + (f - 1) ∘ (W x') + f ∘ (s B A x'),    x' = dropout(x)
//
// which without dropout (x' = x: inference, or lora_dropout 0) is y = f ∘ (W x + s B A x) + b, computed with a
// single base matmul. The backward, with g = dL/dy and v = W x' + s B A x' (per token):
//
//	dL/dm_o = Σ_tokens g_o v_o / n_o                 (n constant: no term through n)
//	dL/dB   = s (f ∘ g)ᵀ (A x'),   dL/dA = s (Bᵀ (f ∘ g))ᵀ x'
//
// so the step keeps v (for m), A x' (for B) and x' (for A); W is frozen and takes no gradient. n is computed
// in float32 whatever the compute dtype: B A [out, in] costs out·in·r per step, as PEFT's lora_weight does.
func (d *DoRA) Forward(ctx adapter.Context, layer models.LinearLayer, x, weight, bias *graph.Node, p map[string]*graph.Node) *graph.Node {
	a, b, m := p[lora.SuffixA], p[lora.SuffixB], p[SuffixMagnitude]
	if a == nil || b == nil || m == nil {
		panic(fmt.Sprintf("dora: layer %s is missing %s, %s or %s", layer.Path, lora.SuffixA, lora.SuffixB, SuffixMagnitude))
	}
	s := d.Config.Scale()
	f32 := func(n *graph.Node) *graph.Node {
		if n.DType() == dtypes.Float32 {
			return n
		}
		return graph.ConvertDType(n, dtypes.Float32)
	}
	// n = ||W + s B A||_row: B A = Linear(B, Aᵀ) ([out, r] times [r, in]).
	ba := engine.Linear(f32(b), graph.Transpose(f32(a), 0, 1), nil)
	full := graph.Add(f32(weight), graph.MulScalar(ba, s))
	norm := graph.StopGradient(graph.Sqrt(graph.ReduceSum(graph.Square(full), 1)))
	factor := graph.Div(f32(m), norm)
	if factor.DType() != x.DType() {
		factor = graph.ConvertDType(factor, x.DType())
	}
	lowRank := func(in *graph.Node) *graph.Node {
		// s multiplies A x' ([tokens, r]) rather than the [tokens, out] update, as package lora does.
		return engine.Linear(graph.MulScalar(engine.Linear(in, a, nil), s), b, nil)
	}
	if ctx.Training && ctx.RNG != nil && d.Config.Dropout > 0 {
		xd := engine.Dropout(ctx.RNG, x, d.Config.Dropout)
		base := engine.Linear(x, weight, bias)
		f := graph.ExpandLeftToRank(factor, base.Rank())
		extra := graph.Add(graph.Mul(graph.AddScalar(f, -1), engine.Linear(xd, weight, nil)), graph.Mul(f, lowRank(xd)))
		return graph.Add(base, extra)
	}
	v := graph.Add(engine.Linear(x, weight, nil), lowRank(x))
	y := graph.Mul(graph.ExpandLeftToRank(factor, v.Rank()), v)
	if bias != nil {
		y = graph.Add(y, graph.ExpandLeftToRank(bias, y.Rank()))
	}
	return y
}

// tensorsOf returns A [r, in], B [out, r] and m [out] from params, checked against the layer.
func (d *DoRA) tensorsOf(layer models.LinearLayer, p models.Params) (a, b, m []float32, rank int, err error) {
	if a, err = p.Float32s(lora.SuffixA); err != nil {
		return
	}
	if b, err = p.Float32s(lora.SuffixB); err != nil {
		return
	}
	if m, err = p.Float32s(SuffixMagnitude); err != nil {
		return
	}
	rank = len(a) / max(layer.In, 1)
	if rank == 0 || len(a) != rank*layer.In || len(b) != layer.Out*rank || len(m) != layer.Out {
		err = fmt.Errorf("DoRA tensors of %s have %d, %d, %d values, want [r, %d], [%d, r] and [%d]",
			layer.Path, len(a), len(b), len(m), layer.In, layer.Out, layer.Out)
	}
	return
}

// directions returns V = W + s B A [out, in] in float64 and its row norms n (PEFT's get_weight_norm).
func (d *DoRA) directions(layer models.LinearLayer, w []float32, a, b []float32, rank int) ([]float64, []float64) {
	v := lora.DeltaWeight(a, b, layer.Out, layer.In, rank, d.Config.Scale())
	n := make([]float64, layer.Out)
	for o := 0; o < layer.Out; o++ {
		row := v[o*layer.In : (o+1)*layer.In]
		sum := 0.0
		for i := range row {
			row[i] += float64(w[o*layer.In+i])
			sum += row[i] * row[i]
		}
		n[o] = math.Sqrt(sum)
	}
	return v, n
}

// Merge returns W' = (m / n) ∘ (W + s B A) row by row, n = ||W + s B A||_row (PEFT's DoRA merge), in float64
// rounded to float32; the bias is unchanged (DoRA scales W x only). A zero row of W + s B A has no direction and
// is refused.
func (d *DoRA) Merge(layer models.LinearLayer, base msnorm.Dense, p models.Params) (msnorm.Dense, error) {
	a, b, m, rank, err := d.tensorsOf(layer, p)
	if err != nil {
		return msnorm.Dense{}, err
	}
	if len(base.W) != layer.Out*layer.In {
		return msnorm.Dense{}, fmt.Errorf("%s: base weight has %d values, want [%d, %d]", layer.Path, len(base.W), layer.Out, layer.In)
	}
	v, n := d.directions(layer, base.W, a, b, rank)
	out := msnorm.Dense{Out: base.Out, In: base.In, W: make([]float32, len(base.W))}
	if base.B != nil {
		out.B = append([]float32(nil), base.B...)
	}
	for o := 0; o < layer.Out; o++ {
		if n[o] == 0 {
			return msnorm.Dense{}, fmt.Errorf("%s: row %d of W + s B A is zero, DoRA's direction is undefined", layer.Path, o)
		}
		f := float64(m[o]) / n[o]
		for i := 0; i < layer.In; i++ {
			out.W[o*layer.In+i] = float32(f * v[o*layer.In+i])
		}
	}
	return out, nil
}

// ErrNoUnmerge is returned by Unmerge: the merged row W'_o = (m_o / n_o) (W_o + s B_o A) has norm |m_o| and
// gives the direction of W_o + s B_o A but not its length n_o, so W_o cannot be recovered from W', A, B and m
// (PEFT can only unmerge because it caches n at merge time).
var ErrNoUnmerge = fmt.Errorf("DoRA cannot be unmerged from its tensors: the merge loses the row norms ||W + s B A||")

// Unmerge returns ErrNoUnmerge (wrapped with the layer's path).
func (d *DoRA) Unmerge(layer models.LinearLayer, _ msnorm.Dense, _ models.Params) (msnorm.Dense, error) {
	return msnorm.Dense{}, fmt.Errorf("%s: %w", layer.Path, ErrNoUnmerge)
}

// UnfoldInput moves the adapter to the layer reading the norm's full output u = g ∘ z (a norm without shift,
// RMSNorm). The folded layer computes, with W_z = W_u diag(g) and A_z = A_u diag(g) (msnorm's change of basis,
// B unchanged),
//
//	(m_z / n_z) ∘ (W_z + s B A_z) z = (m_z / n_z) ∘ (W_u + s B A_u) u,     n_z = ||W_z + s B A_z||_row
//
// while DoRA on u computes (m_u / n_u) ∘ (W_u + s B A_u) u with n_u = ||W_u + s B A_u||_row: the two are the
// same function when m_u = m_z n_u / n_z. The row norms depend on the base weight, which fold.Base gives (W_z as
// the step computes it). A shift beta would leave (m/n) ∘ (W_u + s B A_u) beta on the output, a bias DoRA does
// not have: refused (the merged export has no such limit).
func (d *DoRA) UnfoldInput(layer models.LinearLayer, p models.Params, fold adapter.FoldedInput) (models.Params, error) {
	return d.rebase(layer, p, fold, true)
}

// FoldInput is UnfoldInput's inverse: A_z = A_u diag(g), m_z = m_u n_z / n_u.
func (d *DoRA) FoldInput(layer models.LinearLayer, p models.Params, fold adapter.FoldedInput) (models.Params, error) {
	return d.rebase(layer, p, fold, false)
}

func (d *DoRA) rebase(layer models.LinearLayer, p models.Params, fold adapter.FoldedInput, unfold bool) (models.Params, error) {
	if fold.Norm.HasBeta() {
		return nil, fmt.Errorf("%s follows a norm with a shift (LayerNorm's bias), which DoRA cannot carry into the original basis: DoRA with MS-norm exports only merged here (or train without MS-norm)", layer.Path)
	}
	a, b, m, rank, err := d.tensorsOf(layer, p)
	if err != nil {
		return nil, err
	}
	if len(fold.Base.W) != layer.Out*layer.In {
		return nil, fmt.Errorf("%s: the base weight has %d values, want [%d, %d]", layer.Path, len(fold.Base.W), layer.Out, layer.In)
	}
	wz := fold.Base.W
	wu, _, err := fold.Norm.InputToOriginal(wz, layer.Out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", layer.Path, err)
	}
	var az, au []float32
	if unfold {
		az = a
		if au, _, err = fold.Norm.InputToOriginal(a, rank); err != nil {
			return nil, fmt.Errorf("%s: %w", layer.Path, err)
		}
	} else {
		au = a
		if az, _, err = fold.Norm.InputToFolded(a, rank); err != nil {
			return nil, fmt.Errorf("%s: %w", layer.Path, err)
		}
	}
	_, nz := d.directions(layer, wz, az, b, rank)
	_, nu := d.directions(layer, wu, au, b, rank)
	moved := make([]float32, layer.Out)
	for o := range moved {
		from, to := nz[o], nu[o]
		if !unfold {
			from, to = nu[o], nz[o]
		}
		if from == 0 {
			return nil, fmt.Errorf("%s: row %d of W + s B A is zero, DoRA's direction is undefined", layer.Path, o)
		}
		moved[o] = float32(float64(m[o]) * to / from)
	}
	out := models.Params{}
	for k, v := range p {
		out[k] = v
	}
	out[lora.SuffixA] = tensors.FromFlatDataAndDimensions(au, rank, layer.In)
	if !unfold {
		out[lora.SuffixA] = tensors.FromFlatDataAndDimensions(az, rank, layer.In)
	}
	out[SuffixMagnitude] = tensors.FromFlatDataAndDimensions(moved, p.Dims(SuffixMagnitude)...)
	return out, nil
}

// PEFTConfig returns PEFT's LoRA fields (the run's: lora.Config.PEFTFields) with use_dora true.
func (d *DoRA) PEFTConfig([]string) map[string]any {
	out := d.Config.PEFTFields()
	out[adapter.KeyType], out["use_dora"], out["lora_bias"] = "LORA", true, false
	return out
}

// FromPEFT reads DoRA's settings from a PEFT adapter_config.json (peft_type LORA, use_dora true): LoRA's settings
// (lora.ReadSettings, which refuses fan_in_fan_out and a bias other than "none"); lora_bias, which this example
// does not implement, is refused.
func FromPEFT(c adapter.PEFTConfig) (lora.Config, error) {
	if c.Type() != "LORA" {
		return lora.Config{}, fmt.Errorf("peft_type is %q, want LORA", c.Type())
	}
	if on, err := c.Bool("use_dora"); err != nil {
		return lora.Config{}, err
	} else if !on {
		return lora.Config{}, fmt.Errorf("use_dora is false: a plain LoRA adapter (package lora reads it)")
	}
	if err := c.Refuse("the DoRA example", "lora_bias"); err != nil {
		return lora.Config{}, err
	}
	return lora.ReadSettings(c)
}

// Format is DoRA's import format: PEFT configs with peft_type LORA and use_dora true. init registers it.
var Format = func() adapter.Format {
	f := adapter.NewFormat("DoRA", func(c adapter.PEFTConfig) bool {
		on, _ := c.Bool("use_dora")
		return c.Type() == "LORA" && on
	}, FromPEFT, New)
	f.Selector = "peft_type LORA with use_dora true"
	return f
}()

func init() { adapter.Register(Format) }
