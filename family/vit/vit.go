// Package vit is the ViT family (model_type "vit"): the ViT graph of models/vit as a trainable finetune.Model
// (image classification), registered with finetune from this package's init: loader, presets, planner shapes,
// random batches, image data, new classification heads. A program that trains ViTs imports it (or family/all)
// for that side effect.
package vit

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	vitmodel "github.com/memfit/memfit/models/vit"
)

func init() { finetune.RegisterFamily(Family()) }

// Family returns the ViT family's registration.
func Family() finetune.Family {
	return finetune.Family{
		Name:  "vit",
		Title: "ViT",
		Of:    func(m finetune.Model) bool { _, ok := m.(Model); return ok },
		Load: func(dir string, opts finetune.ModelOptions) (finetune.Model, error) {
			m, err := vitmodel.Load(dir, opts.Model())
			if err != nil {
				return nil, err
			}
			return Model{Model: m}, nil
		},
		Rebuild: func(m finetune.Model, params models.Params, msNorm bool) (finetune.Model, error) {
			return m.(Model).rebuild(params, msNorm)
		},
		RandomParams: func(m finetune.Model, seed uint64) models.Params {
			return vitmodel.RandomParams(m.(Model).Config, seed)
		},
		Shaped: func(dir string, opts finetune.ModelOptions) (finetune.Model, error) {
			c, err := vitmodel.LoadConfig(dir)
			if err != nil {
				return nil, err
			}
			return Model{Model: &vitmodel.Model{Config: c, Options: opts.Model()}}, nil
		},
		Preset: func(name string, labels int, opts finetune.ModelOptions) (finetune.Model, error) {
			c, err := vitmodel.Preset(name, labels)
			if err != nil {
				return nil, err
			}
			return Model{Model: &vitmodel.Model{Config: c, Options: opts.Model()}}, nil
		},
		Presets:       slices.Sorted(maps.Keys(vitmodel.Presets)),
		FixedSequence: "a ViT's sequence is fixed by its image size",
		BatchShapes: func(m finetune.Model, in finetune.Shape) (map[string]shapes.Shape, error) {
			c := m.(Model).Config
			return map[string]shapes.Shape{
				"pixel_values": shapes.Make(dtypes.Float32, in.Batch, c.NumChannels, c.ImageSize, c.ImageSize),
				"labels":       shapes.Make(dtypes.Int32, in.Batch),
			}, nil
		},
		RandomBatch: func(m finetune.Model, in finetune.Shape, seed uint64) finetune.Batch {
			c := m.(Model).Config
			r := rand.New(rand.NewPCG(seed, 7))
			px := make([]float32, in.Batch*c.NumChannels*c.ImageSize*c.ImageSize)
			for i := range px {
				px[i] = float32(r.NormFloat64())
			}
			labels := make([]int32, in.Batch)
			for i := range labels {
				labels[i] = int32(r.IntN(max(1, len(c.Labels))))
			}
			return finetune.Batch{"pixel_values": tensors.FromFlatDataAndDimensions(px, in.Batch, c.NumChannels, c.ImageSize, c.ImageSize),
				"labels": tensors.FromFlatDataAndDimensions(labels, in.Batch)}
		},
		Formats:  finetune.ImageFormats,
		OpenData: finetune.OpenImageData,
		Trainable: func(m finetune.Model) error {
			if len(m.(Model).Config.Labels) == 0 {
				return fmt.Errorf("%w: give it one (finetune init --from MODEL --num-labels N; finetune memory --num-labels N)", finetune.ErrNoHead)
			}
			return nil
		},
		Cut: func(m finetune.Model, blocks int) finetune.Model {
			v := m.(Model)
			c := v.Config
			c.NumHiddenLayers = min(blocks, c.NumHiddenLayers)
			opts := v.Options
			opts.Blocks = nil // the per-block plan is set afterwards, for the cut's blocks
			return Model{Model: &vitmodel.Model{Config: c, Options: opts}}
		},
		BlockFLOPs: func(m finetune.Model, in finetune.Shape) float64 {
			c := m.(Model).Config
			h, seq := float64(c.HiddenSize), float64(c.NumPatches()+1)
			tokens := float64(in.Batch) * seq
			linear := 4*h*h + 2*h*float64(c.IntermediateSize) // q, k, v, output; MLP in and out
			return 2*tokens*linear + 4*tokens*seq*h
		},
		NewHead: func(m finetune.Model, labels []string, seed uint64) ([]byte, models.Params, error) {
			// classifier.weight normal(0, 0.02) and classifier.bias zero, as transformers initialises a new head.
			c := m.(Model).Config
			c.Architecture, c.Labels = vitmodel.ArchClassification, labels
			params := maps.Clone(m.Params())
			head := models.RandomParams(map[string][]int{vitmodel.ClassifierWeight: {len(labels), c.HiddenSize}, vitmodel.ClassifierBias: {len(labels)}},
				seed, 0x4ead, func(name string, dims []int) models.Init {
					if len(dims) == 1 {
						return models.Init{}
					}
					return models.Init{Std: 0.02}
				})
			maps.Copy(params, head)
			config, err := c.JSON()
			return config, params, err
		},
	}
}

// Model adapts a models/vit model as a finetune.Model: image classification with cross entropy over "labels"
// [B] (class indices) given "pixel_values" [B, C, H, W].
type Model struct{ *vitmodel.Model }

// Params returns the model's graph parameters.
func (m Model) Params() models.Params { return m.Model.Params }

// LinearLayers returns the ViT's linear layers.
func (m Model) LinearLayers() []models.LinearLayer { return vitmodel.LinearLayers(m.Config) }

// BatchInputs returns pixel_values and labels.
func (m Model) BatchInputs() []string { return []string{"labels", "pixel_values"} }

// Loss is the mean cross entropy of the logits against the labels.
func (m Model) Loss(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	if len(m.Config.Labels) == 0 {
		panic(fmt.Errorf("vit: a ViTModel has no classifier to train; use ViTForImageClassification (init with --num-labels)"))
	}
	return loss.CrossEntropy(loss.Float32(m.Logits(b, batch)), batch["labels"], loss.IgnoreIndex)
}

// Logits returns the classifier's logits [B, labels].
func (m Model) Logits(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	out := m.Forward(b, batch["pixel_values"])
	if out.Logits == nil {
		// A ViTModel has no classifier (CheckTrainable refuses to train it): its output is the last hidden state.
		return out.LastHidden
	}
	return out.Logits
}

// ImageSpec describes the images the ViT takes and its classes (finetune.ImageModel).
func (m Model) ImageSpec() finetune.ImageSpec {
	return finetune.ImageSpec{Channels: m.Config.NumChannels, ImageSize: m.Config.ImageSize, Labels: m.Config.Labels}
}

// Folds lists the model's MS-LN folds.
func (m Model) Folds() []models.Fold { return vitmodel.Folds(m.Config) }

// Task returns "" (PEFT has no image-classification task type).
func (m Model) Task() string { return "" }

// Shapes returns the checkpoint's parameter shapes.
func (m Model) Shapes() map[string][]int { return vitmodel.Shapes(m.Config) }

// Folded returns the norm tensors removed by folding.
func (m Model) Folded() models.Params { return m.Model.Folded }

// ConfigJSON returns the model's config.json.
func (m Model) ConfigJSON() ([]byte, error) { return m.Config.JSON() }

// BlockModes returns the ViT's per-block plan and its number of encoder layers.
func (m Model) BlockModes() ([]models.BlockMode, int) {
	return m.Options.Blocks, m.Config.NumHiddenLayers
}

// SetBlockModes sets the ViT's per-block plan.
func (m Model) SetBlockModes(modes []models.BlockMode) { m.Options.Blocks = modes }

// GradCheckpoint reports the ViT's model-wide gradient checkpointing.
func (m Model) GradCheckpoint() bool { return m.Options.GradCheckpoint }

func (m Model) rebuild(params models.Params, msNorm bool) (finetune.Model, error) {
	opts := m.Options
	opts.MSNorm = msNorm
	v, err := vitmodel.New(m.Config, params, opts)
	return Model{Model: v}, err
}

// CheckBatch checks a ViT batch: pixel_values [B, channels, H, W] with the model's channels, and labels [B]
// class indices within the model's classes.
func (m Model) CheckBatch(b finetune.Batch) error {
	if px, ok := b["pixel_values"]; ok {
		if px.Rank() != 4 || px.Shape().Dim(1) != m.Config.NumChannels {
			return fmt.Errorf("pixel_values has shape %v; the model takes [batch, %d, height, width]", px.Shape().Dimensions, m.Config.NumChannels)
		}
		if h, w := px.Shape().Dim(2), px.Shape().Dim(3); h != m.Config.ImageSize || w != m.Config.ImageSize {
			return fmt.Errorf("pixel_values are %dx%d images but the model takes %dx%d (image_size in its config.json): resize them (image folders and tars are resized by the model's preprocessor)", h, w, m.Config.ImageSize, m.Config.ImageSize)
		}
		if !px.DType().IsFloat() {
			return fmt.Errorf("pixel_values are %s; the model takes floating-point pixels (float32, normalized as its preprocessor_config.json says)", px.DType())
		}
	}
	if l, ok := b["labels"]; ok {
		if len(m.Config.Labels) == 0 {
			return fmt.Errorf("the batch has labels but the model has no classification head (ViTModel)")
		}
		return models.CheckRange(l, "labels", 0, len(m.Config.Labels),
			fmt.Sprintf("the model has %d classes (num_labels in its config.json)", len(m.Config.Labels)))
	}
	return nil
}
