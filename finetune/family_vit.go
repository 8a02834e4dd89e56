package finetune

// The ViT family: vit.Model as a trainable Model, its registration (loader, presets, planner shapes, random
// batches) and its data (image folders, tars and IDX files).

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
)

// vitFamily is the ViT family's registration.
func vitFamily() Family {
	return Family{
		Name:  "vit",
		Title: "ViT",
		Of:    func(m Model) bool { _, ok := m.(ViT); return ok },
		Load: func(dir string, opts ModelOptions) (Model, error) {
			m, err := vit.Load(dir, vitOptions(opts))
			if err != nil {
				return nil, err
			}
			return ViT{Model: m}, nil
		},
		Rebuild: func(m Model, params models.Params, msNorm bool) (Model, error) {
			return m.(ViT).rebuild(params, msNorm)
		},
		RandomParams: func(m Model, seed uint64) models.Params {
			return vit.RandomParams(m.(ViT).Config, seed)
		},
		Shaped: func(dir string, opts ModelOptions) (Model, error) {
			c, err := vit.LoadConfig(dir)
			if err != nil {
				return nil, err
			}
			return ViT{Model: &vit.Model{Config: c, Options: vitOptions(opts)}}, nil
		},
		Preset: func(name string, labels int, opts ModelOptions) (Model, error) {
			c, err := vit.Preset(name, labels)
			if err != nil {
				return nil, err
			}
			return ViT{Model: &vit.Model{Config: c, Options: vitOptions(opts)}}, nil
		},
		Presets:       slices.Sorted(maps.Keys(vit.Presets)),
		FixedSequence: "a ViT's sequence is fixed by its image size",
		BatchShapes: func(m Model, in Shape) (map[string]shapes.Shape, error) {
			c := m.(ViT).Config
			return map[string]shapes.Shape{
				"pixel_values": shapes.Make(dtypes.Float32, in.Batch, c.NumChannels, c.ImageSize, c.ImageSize),
				"labels":       shapes.Make(dtypes.Int32, in.Batch),
			}, nil
		},
		RandomBatch: func(m Model, in Shape, seed uint64) Batch {
			c := m.(ViT).Config
			r := rand.New(rand.NewPCG(seed, 7))
			px := make([]float32, in.Batch*c.NumChannels*c.ImageSize*c.ImageSize)
			for i := range px {
				px[i] = float32(r.NormFloat64())
			}
			labels := make([]int32, in.Batch)
			for i := range labels {
				labels[i] = int32(r.IntN(max(1, len(c.Labels))))
			}
			return Batch{"pixel_values": tensors.FromFlatDataAndDimensions(px, in.Batch, c.NumChannels, c.ImageSize, c.ImageSize),
				"labels": tensors.FromFlatDataAndDimensions(labels, in.Batch)}
		},
		Formats:    []string{FormatImages, FormatImageTar, FormatIDX},
		OpenData:   openImages,
		WrongModel: func(format string) error { return fmt.Errorf("image data (%s) needs a ViT model", format) },
		Trainable: func(m Model) error {
			if len(m.(ViT).Config.Labels) == 0 {
				return fmt.Errorf("%w: give it one (finetune init --from MODEL --num-labels N; finetune memory --num-labels N)", ErrNoHead)
			}
			return nil
		},
		Cut: func(m Model, blocks int) Model {
			v := m.(ViT)
			c := v.Config
			c.NumHiddenLayers = min(blocks, c.NumHiddenLayers)
			opts := v.Options
			opts.Blocks = nil // the per-block plan is set afterwards, for the cut's blocks
			return ViT{Model: &vit.Model{Config: c, Options: opts}}
		},
		BlockFLOPs: func(m Model, in Shape) float64 {
			c := m.(ViT).Config
			h, seq := float64(c.HiddenSize), float64(c.NumPatches()+1)
			tokens := float64(in.Batch) * seq
			linear := 4*h*h + 2*h*float64(c.IntermediateSize) // q, k, v, output; MLP in and out
			return 2*tokens*linear + 4*tokens*seq*h
		},
	}
}

// vitOptions are a ViT's options in the modes of opts.
func vitOptions(opts ModelOptions) vit.Options {
	return vit.Options{ApproxActivation: opts.ApproxAct, MSNorm: opts.MSNorm, GradCheckpoint: opts.GradCkpt, Attention: opts.Attention}
}

// ViT adapts a vit.Model: image classification with cross entropy over "labels" [B] (class indices) given
// "pixel_values" [B, C, H, W].
type ViT struct{ *vit.Model }

// Params returns the model's graph parameters.
func (m ViT) Params() models.Params { return m.Model.Params }

// LinearLayers returns the ViT's linear layers.
func (m ViT) LinearLayers() []models.LinearLayer { return vit.LinearLayers(m.Config) }

// BatchInputs returns pixel_values and labels.
func (m ViT) BatchInputs() []string { return []string{"labels", "pixel_values"} }

// Loss is the mean cross entropy of the logits against the labels.
func (m ViT) Loss(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	return loss.CrossEntropy(toF32(m.Logits(b, batch)), batch["labels"], loss.IgnoreIndex)
}

// Logits returns the classifier's logits [B, labels].
func (m ViT) Logits(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	out := m.Forward(b, batch["pixel_values"])
	if out.Logits == nil {
		panic(fmt.Errorf("finetune: a ViTModel has no classifier to train; use ViTForImageClassification (init with --num-labels)"))
	}
	return out.Logits
}

// Folds lists the model's MS-LN folds.
func (m ViT) Folds() []models.Fold { return vit.Folds(m.Config) }

// Task returns "" (PEFT has no image-classification task type).
func (m ViT) Task() string { return "" }

// Shapes returns the checkpoint's parameter shapes.
func (m ViT) Shapes() map[string][]int { return vit.Shapes(m.Config) }

// Folded returns the norm tensors removed by folding.
func (m ViT) Folded() models.Params { return m.Model.Folded }

// ConfigJSON returns the model's config.json.
func (m ViT) ConfigJSON() ([]byte, error) { return m.Config.JSON() }

// BlockModes returns the ViT's per-block plan and its number of encoder layers.
func (m ViT) BlockModes() ([]models.BlockMode, int) {
	return m.Options.Blocks, m.Config.NumHiddenLayers
}

// SetBlockModes sets the ViT's per-block plan.
func (m ViT) SetBlockModes(modes []models.BlockMode) { m.Options.Blocks = modes }

// GradCheckpoint reports the ViT's model-wide gradient checkpointing.
func (m ViT) GradCheckpoint() bool { return m.Options.GradCheckpoint }

func (m ViT) rebuild(params models.Params, msNorm bool) (Model, error) {
	opts := m.Options
	opts.MSNorm = msNorm
	v, err := vit.New(m.Config, params, opts)
	return ViT{Model: v}, err
}

// CheckBatch checks a ViT batch: pixel_values [B, channels, H, W] with the model's channels, and labels [B]
// class indices within the model's classes.
func (m ViT) CheckBatch(b Batch) error {
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
		return checkRange(l, "labels", 0, len(m.Config.Labels), false,
			fmt.Sprintf("the model has %d classes (num_labels in its config.json)", len(m.Config.Labels)))
	}
	return nil
}

// ErrNoHead is returned when a bare ViTModel (no classification head) is to be trained: it has no loss.
var ErrNoHead = errors.New("the model is a bare ViTModel with no classification head, so it has no loss to train")

// OpenImages opens an image dataset in one of the image formats.
func OpenImages(path, format, split string) (data.ImageSource, error) {
	switch format {
	case FormatImages:
		return data.ImageFolder(filepath.Join(path, split))
	case FormatImageTar:
		return data.ImageTar(path, split)
	case FormatIDX:
		parts := strings.Split(path, ",")
		if len(parts) != 2 {
			return nil, fmt.Errorf("IDX data is \"images.idx[.gz],labels.idx[.gz]\", got %q", path)
		}
		imgs, err := data.ReadIDX(parts[0])
		if err != nil {
			return nil, err
		}
		labs, err := data.ReadIDX(parts[1])
		if err != nil {
			return nil, err
		}
		return data.IDXImages(imgs, labs, nil)
	}
	return nil, fmt.Errorf("%q is not an image format", format)
}

// imageIterator is the Iterator of an image loader, with the notes opening the data gave (DataNotes).
type imageIterator struct {
	l     *data.ImageLoader
	notes []string
}

func wrapImages(l *data.ImageLoader, err error) (Iterator, error) {
	if err != nil {
		return nil, err
	}
	return imageIterator{l: l}, nil
}

func (it imageIterator) Next() (Batch, error) {
	b, err := it.l.Next()
	return Batch(b), err
}

func (it imageIterator) State() (json.RawMessage, error) { return it.l.State() }

func (it imageIterator) Restore(s json.RawMessage) error { return it.l.Restore(s) }

// openImages opens image data (FormatImages, FormatImageTar, FormatIDX) for the ViT m: its classes must be the
// model's, and the images are preprocessed as the model folder's preprocessor_config.json says.
func openImages(src DataSource) (Iterator, error) {
	path, opts, modelDir := src.Path, src.Options, src.ModelDir
	v := src.Model.(ViT)
	images, err := openImageSource(path, src.Format, opts)
	if err != nil {
		return nil, err
	}
	if v.Config.Architecture == "" || len(v.Config.Labels) != len(images.Classes()) {
		if err := labelsWithin(images, len(v.Config.Labels)); err != nil && src.Format == FormatIDX {
			return nil, fmt.Errorf("%s: %w", path, err) // the labels are the classes: name the image that has too many
		}
		return nil, fmt.Errorf("%s has %d classes %v but the model classifies %d: give the model a head of %d (finetune init --from %s --num-labels %d --out NEW)",
			path, len(images.Classes()), images.Classes(), len(v.Config.Labels), len(images.Classes()), modelDir, len(images.Classes()))
	}
	pre, err := data.ReadPreprocessor(modelDir, v.Config.NumChannels, v.Config.ImageSize)
	if err != nil {
		return nil, err
	}
	var aug *data.Augment
	if opts.Augment {
		aug = &data.Augment{Pad: max(1, v.Config.ImageSize/8), Flip: true}
	}
	return wrapImages(data.NewImageLoader(images, pre, aug, src.BatchSize, src.Seed, true))
}
