package lora

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
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

// New returns a constructor for NewSet that gives every layer a LoRA adapter with cfg.
func New(cfg Config) (func(models.LinearLayer) Adapter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return func(models.LinearLayer) Adapter { return &LoRA{Config: cfg} }, nil
}

// PEFT key suffixes of the two LoRA matrices, and of the optional bias of B (PEFT's lora_bias).
const (
	SuffixA     = "lora_A.weight"
	SuffixB     = "lora_B.weight"
	SuffixBBias = "lora_B.bias"
)

// Type returns "LORA".
func (l *LoRA) Type() string { return "LORA" }

// Init initialises as PEFT does: A Kaiming-uniform with a = sqrt(5) (uniform in ±1/sqrt(in)), B zero, so the
// adapted layer starts equal to the base layer.
func (l *LoRA) Init(layer models.LinearLayer, r *rand.Rand) (map[string]*tensors.Tensor, error) {
	rank := l.Config.Rank
	if rank > min(layer.In, layer.Out) {
		return nil, fmt.Errorf("LoRA rank %d exceeds the layer's size [%d, %d]", rank, layer.Out, layer.In)
	}
	bound := 1 / math.Sqrt(float64(layer.In))
	a := make([]float32, rank*layer.In)
	for i := range a {
		a[i] = float32((2*r.Float64() - 1) * bound)
	}
	return map[string]*tensors.Tensor{
		SuffixA: tensors.FromFlatDataAndDimensions(a, rank, layer.In),
		SuffixB: tensors.FromFlatDataAndDimensions(make([]float32, layer.Out*rank), layer.Out, rank),
	}, nil
}

// Trainable: B (and its bias, when present) always, A unless LoRA-FA.
func (l *LoRA) Trainable(suffix string) bool {
	return suffix == SuffixB || suffix == SuffixBBias || (suffix == SuffixA && !l.Config.FrozenA)
}

// Forward returns W x + b + scale · (B (A x) + b_B), b_B being present only for adapters imported or exported
// with PEFT's lora_bias. Backward (through engine.Linear's matmul gradients): the base matmul keeps x only if W
// is trained; A's gradient needs x (shared with a memory-sharing norm's output when the layer follows one); B's
// gradient needs A x (rank r per token). With LoRA-FA, A is frozen and only A x is kept.
func (l *LoRA) Forward(ctx Context, layer models.LinearLayer, x, weight, bias *graph.Node, p map[string]*graph.Node) *graph.Node {
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

// Settings returns PEFT's adapter_config.json LoRA fields.
func (l *LoRA) Settings() map[string]any {
	return map[string]any{"r": l.Config.Rank, "lora_alpha": l.Config.Alpha, "use_rslora": l.Config.RSLoRA,
		"lora_dropout": l.Config.Dropout, "fan_in_fan_out": false, "init_lora_weights": true, "use_dora": false}
}
