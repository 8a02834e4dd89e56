package vit

import (
	"fmt"

	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
	"github.com/memfit/memfit/safetensors"
)

// Hugging Face names of the parameters outside the encoder layers.
const (
	ClsToken          = "vit.embeddings.cls_token"
	PositionEmbedding = "vit.embeddings.position_embeddings"
	PatchWeight       = "vit.embeddings.patch_embeddings.projection.weight"
	PatchBias         = "vit.embeddings.patch_embeddings.projection.bias"
	FinalNormWeight   = "vit.layernorm.weight"
	FinalNormBias     = "vit.layernorm.bias"
	ClassifierWeight  = "classifier.weight"
	ClassifierBias    = "classifier.bias"
)

// LayerPrefix returns the name prefix of encoder layer i: "vit.encoder.layer.{i}.".
func LayerPrefix(i int) string { return fmt.Sprintf("vit.encoder.layer.%d.", i) }

// Options choose the memory-saving modes a model is built in (models.Options; the approximate activation is
// ReGELU2, and MS-LN folds every LayerNorm whose output feeds linear layers into them).
type Options = models.Options

// Model is a ViT (ViTModel or ViTForImageClassification) ready to be built into graphs.
type Model struct {
	Config  Config
	Options Options
	// Params are the graph's parameters by Hugging Face name; with MSNorm, folded (the folded norms' tensors
	// are absent and the linear layers they fed carry the folded weights and biases).
	Params models.Params
	// Folded holds the original tensors of the norms removed by folding (empty without MSNorm), for export.
	Folded models.Params
}

// Shapes returns every parameter name of cfg's model with its shape.
func Shapes(cfg Config) map[string][]int {
	d, m, c, p := cfg.HiddenSize, cfg.IntermediateSize, cfg.NumChannels, cfg.PatchSize
	s := map[string][]int{
		ClsToken:          {1, 1, d},
		PositionEmbedding: {1, cfg.NumPatches() + 1, d},
		PatchWeight:       {d, c, p, p},
		PatchBias:         {d},
		FinalNormWeight:   {d},
		FinalNormBias:     {d},
	}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		pre := LayerPrefix(i)
		for name, dims := range map[string][]int{
			NormBeforeWeight: {d}, NormBeforeBias: {d},
			QueryWeight: {d, d}, KeyWeight: {d, d}, ValueWeight: {d, d},
			OutWeight: {d, d}, OutBias: {d},
			NormAfterWeight: {d}, NormAfterBias: {d},
			UpWeight: {m, d}, UpBias: {m}, DownWeight: {d, m}, DownBias: {d},
		} {
			s[pre+name] = dims
		}
		if cfg.QKVBias {
			s[pre+QueryBias], s[pre+KeyBias], s[pre+ValueBias] = []int{d}, []int{d}, []int{d}
		}
	}
	if cfg.Architecture == ArchClassification {
		s[ClassifierWeight] = []int{len(cfg.Labels), d}
		s[ClassifierBias] = []int{len(cfg.Labels)}
	}
	return s
}

// Folds lists the MS-LN folds of cfg's model: which norm's affine goes into which linear layers.
func Folds(cfg Config) []models.Fold {
	var out []models.Fold
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		out = append(out, layerFolds(LayerPrefix(i))...)
	}
	if cfg.Architecture == ArchClassification {
		out = append(out, models.Fold{Gamma: FinalNormWeight, Beta: FinalNormBias,
			Linears: []models.Linear{{Weight: ClassifierWeight, Bias: ClassifierBias}}})
	}
	return out
}

// Architecture returns what building cfg's model from its weights needs (models.Prepare).
func Architecture(cfg Config) models.Architecture {
	return models.Architecture{Shapes: Shapes(cfg), Folds: Folds(cfg), Blocks: cfg.NumHiddenLayers}
}

// New checks params against cfg (every expected name present with its shape, nothing else, all float32) and
// returns the model in the given modes, folding the norms when opts.MSNorm.
func New(cfg Config, params models.Params, opts Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p, folded, err := models.Prepare(Architecture(cfg), params, opts.Blocks, opts.MSNorm)
	if err != nil {
		return nil, err
	}
	return &Model{Config: cfg, Options: opts, Params: p, Folded: folded}, nil
}

// RandomParams returns freshly initialised parameters for cfg, as transformers' ViT initialisation does:
// linear, patch and embedding weights normal(0, 0.02) (transformers truncates at 2 standard deviations; so does
// this), biases zero, LayerNorm weights one.
func RandomParams(cfg Config, seed uint64) models.Params {
	return models.RandomParams(Shapes(cfg), seed, 0x717, func(name string, dims []int) models.Init {
		switch {
		case isNormWeight(name):
			return models.Init{Const: 1}
		case len(dims) == 1:
			return models.Init{} // biases: zero
		}
		return models.Init{Std: 0.02, Truncate: 2}
	})
}

func isNormWeight(name string) bool {
	return hasSuffix(name, NormBeforeWeight) || hasSuffix(name, NormAfterWeight) || name == FinalNormWeight
}

func hasSuffix(s, suffix string) bool {
	return len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix
}

// Outputs are the nodes a forward pass produces. Unused ones cost nothing: only what a compiled graph outputs
// is executed.
type Outputs struct {
	// Logits are [B, labels] (nil for ViTModel).
	Logits *graph.Node
	// Hidden are the embeddings and every layer's output, [B, tokens, hidden] (as transformers'
	// hidden_states: the last one before the final LayerNorm).
	Hidden []*graph.Node
	// LastHidden is the final LayerNorm's output [B, tokens, hidden] (nil when that norm was folded into the
	// classifier).
	LastHidden *graph.Node
}

// Forward builds the model on pixels [B, channels, height, width] (NCHW, float32, normalised as the model
// expects), with its parameters from b (see models.Bind). Images whose size differs from the configuration's
// get position embeddings interpolated bicubically, as transformers' interpolate_pos_encoding does.
func (m *Model) Forward(b models.Bound, pixels *graph.Node) Outputs {
	cfg := m.Config
	if pixels.Rank() != 4 || pixels.Shape().Dim(1) != cfg.NumChannels {
		panic(fmt.Sprintf("vit: pixel_values must be [B, %d, H, W], got %s", cfg.NumChannels, pixels.Shape()))
	}
	x := embed(b, pixels, cfg)
	out := Outputs{Hidden: []*graph.Node{x}}
	opt := BlockOptions{Heads: cfg.NumAttentionHeads, Eps: cfg.LayerNormEps, ApproxActivation: m.Options.ApproxActivation,
		MSNorm: m.Options.MSNorm, Attention: m.Options.Attention}
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		prefix := LayerPrefix(i)
		mode, perBlock := models.Mode(m.Options.Blocks, i, m.Options.ApproxActivation, m.Options.GradCheckpoint)
		blockOpt := opt
		blockOpt.ApproxActivation = mode.ApproxActivation
		x = b.ApplyBlock(prefix, x, mode, perBlock, func(b models.Bound, x *graph.Node) *graph.Node { return Block(x, b, prefix, blockOpt) })
		out.Hidden = append(out.Hidden, x)
	}
	if gamma := b.Node(FinalNormWeight); gamma != nil {
		out.LastHidden = msnorm.LayerNorm(x, gamma, b.Node(FinalNormBias), cfg.LayerNormEps)
	}
	if cfg.Architecture != ArchClassification {
		return out
	}
	// The classifier reads the CLS token only, and LayerNorm is per token: normalise just that row.
	cls := graph.Reshape(engine.SliceAxis(x, 1, 0, 1), x.Shape().Dim(0), cfg.HiddenSize)
	var normed *graph.Node
	if m.Options.MSNorm {
		normed = msnorm.MSLayerNorm(cls, cfg.LayerNormEps)
	} else {
		normed = msnorm.LayerNorm(cls, b.Node(FinalNormWeight), b.Node(FinalNormBias), cfg.LayerNormEps)
	}
	out.Logits = b.ApplyLinear("classifier", normed)
	return out
}

// embed returns the CLS token and the patch embeddings plus position embeddings, [B, 1 + patches, hidden].
// The patch projection (a convolution with stride = kernel = patch size) is a matmul over flattened patches:
// patch (r, c) of the image is row r * (W/P) + c, its pixels flattened in (channel, y, x) order, matching the
// [hidden, C, P, P] weight reshaped to [hidden, C*P*P].
func embed(b models.Bound, pixels *graph.Node, cfg Config) *graph.Node {
	batch, c, h, w := pixels.Shape().Dim(0), pixels.Shape().Dim(1), pixels.Shape().Dim(2), pixels.Shape().Dim(3)
	p := cfg.PatchSize
	if h%p != 0 || w%p != 0 {
		panic(fmt.Sprintf("vit: image %dx%d is not a multiple of the patch size %d", h, w, p))
	}
	gh, gw := h/p, w/p
	patches := graph.Reshape(pixels, batch, c, gh, p, gw, p)
	patches = graph.TransposeAllDims(patches, 0, 2, 4, 1, 3, 5)
	patches = graph.Reshape(patches, batch, gh*gw, c*p*p)
	kernel := graph.Reshape(b.Node(PatchWeight), cfg.HiddenSize, c*p*p)
	emb := engine.Linear(patches, kernel, b.Node(PatchBias)) // a convolution: adapters do not apply
	cls := graph.BroadcastToDims(b.Node(ClsToken), batch, 1, cfg.HiddenSize)
	x := graph.Concatenate([]*graph.Node{cls, emb}, 1)
	return graph.Add(x, positions(b.Node(PositionEmbedding), cfg, gh, gw))
}

// positions returns the position embeddings for a gh x gw patch grid: as stored when the grid matches the
// configuration, otherwise the CLS position followed by the patch positions interpolated bicubically
// (torch.nn.functional.interpolate, mode "bicubic", align_corners False), which is a fixed linear map applied
// as a matmul, so the gradient reaches the stored embeddings.
func positions(pos *graph.Node, cfg Config, gh, gw int) *graph.Node {
	side := cfg.ImageSize / cfg.PatchSize
	if gh == side && gw == side {
		return pos
	}
	d := cfg.HiddenSize
	clsPos := engine.SliceAxis(pos, 1, 0, 1)
	grid := graph.Reshape(engine.SliceAxis(pos, 1, 1, side*side+1), side*side, d)
	m := bicubic2D(side, side, gh, gw)
	interp := engine.DotGeneral(graph.Const(pos.Graph(), m), []int{1}, nil, grid, []int{0}, nil) // [gh*gw, d]
	return graph.Concatenate([]*graph.Node{clsPos, graph.Reshape(interp, 1, gh*gw, d)}, 1)
}

// LinearLayers lists cfg's linear layers (query, key, value, output and MLP projections of every layer, and the
// classifier as the head); the patch projection is a convolution and is not listed.
func LinearLayers(cfg Config) []models.LinearLayer {
	return models.LinearLayers(Shapes(cfg), []string{"classifier"}, PatchWeight)
}

// Load reads a ViT model folder (config.json and safetensors weights) and returns the model in the given modes.
// ViTModel checkpoints saved without the "vit." prefix are accepted, and their pooler is skipped (memfit's
// ViTModel returns hidden states only).
func Load(dir string, opts Options) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	shapes := Shapes(cfg)
	lo := models.LoadOptions{Ignore: func(n string) bool {
		return hasPrefix(n, "vit.pooler.") || hasPrefix(n, "pooler.")
	}}
	if cfg.Architecture == ArchModel && !checkpointHas(dir, ClsToken) {
		lo.Rename = func(n string) string { return trimPrefix(n, "vit.") }
	}
	params, err := models.LoadParams(dir, shapes, lo)
	if err != nil {
		return nil, err
	}
	m, err := New(cfg, params, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return m, nil
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }
func trimPrefix(s, p string) string {
	if hasPrefix(s, p) {
		return s[len(p):]
	}
	return s
}

// checkpointHas reports whether the checkpoint in dir has a tensor (false when it cannot be opened: the load
// that follows reports that).
func checkpointHas(dir, name string) bool {
	c, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return false
	}
	defer c.Close()
	_, ok := c.Info(name)
	return ok
}
