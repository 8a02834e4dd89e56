// Package finetune trains models: the training step (loss, gradients, optimizer), the loop (schedules,
// accumulation, clipping, logging, NaN checks), checkpoints with exact resume, and export to PEFT adapters and
// merged Hugging Face checkpoints.
package finetune

import (
	"fmt"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/runner"
)

// Model is what the trainer needs from a model: its parameters, its linear layers (for adapters) and the loss of
// a batch.
type Model interface {
	// runner.Model: Params (by Hugging Face name, folded when MS-norm is on), LinearLayers (what adapters can
	// wrap) and Logits (of a batch; labels are not needed).
	runner.Model
	// BatchInputs lists the names of the batch tensors the loss reads ("labels" included).
	BatchInputs() []string
	// Loss builds the mean loss of a batch from the bound parameters and the batch's nodes by name.
	Loss(b models.Bound, batch map[string]*graph.Node) *graph.Node
	// Folds lists the norm folds MS-norm applies (the folded norms' tensors are in Folded when it is on).
	Folds() []models.Fold
	// Task returns PEFT's task_type for the model ("CAUSAL_LM", "SEQ_CLS" or "" for none).
	Task() string
	// Shapes returns the architecture's parameter names and shapes, as in its Hugging Face checkpoint.
	Shapes() map[string][]int
	// Folded returns the norm tensors removed by MS-norm folding (empty without it), for export.
	Folded() models.Params
	// Config returns the model's config.json bytes.
	ConfigJSON() ([]byte, error)
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

// Llama adapts a llama.Model: causal language modelling (next-token cross entropy, labels [B, T] with -100 for
// positions to skip, shifted by one inside the loss) or sequence classification (labels [B]), given
// "input_ids" and "attention_mask" [B, T].
type Llama struct{ *llama.Model }

// Params returns the model's graph parameters.
func (m Llama) Params() models.Params { return m.Model.Params }

// LinearLayers returns the LLaMA's linear layers.
func (m Llama) LinearLayers() []models.LinearLayer { return llama.LinearLayers(m.Config) }

// BatchInputs returns attention_mask, input_ids and labels.
func (m Llama) BatchInputs() []string { return []string{"attention_mask", "input_ids", "labels"} }

// Logits returns the logits: [B, T, vocab] for the causal LM, [B, labels] for the classifier.
func (m Llama) Logits(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	return m.Forward(b, batch["input_ids"], batch["attention_mask"]).Logits
}

// Folds lists the model's MS-RMSNorm folds.
func (m Llama) Folds() []models.Fold { return llama.Folds(m.Config) }

// Task returns CAUSAL_LM or SEQ_CLS.
func (m Llama) Task() string {
	if m.Config.Architecture == llama.ArchClassification {
		return "SEQ_CLS"
	}
	return "CAUSAL_LM"
}

// Shapes returns the checkpoint's parameter shapes.
func (m Llama) Shapes() map[string][]int { return llama.Shapes(m.Config) }

// Loss is the next-token cross entropy (causal LM) or the classification cross entropy.
func (m Llama) Loss(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	logits := toF32(m.Logits(b, batch))
	labels := batch["labels"]
	if m.Config.Architecture == llama.ArchClassification {
		if len(m.Config.Labels) == 1 { // regression (as transformers with num_labels 1): mean squared error
			d := graph.Sub(graph.Reshape(logits, logits.Shape().Dim(0)), graph.ConvertDType(labels, dtypes.Float32))
			return graph.ReduceAllMean(graph.Mul(d, d))
		}
		return loss.CrossEntropy(logits, labels, loss.IgnoreIndex)
	}
	n := logits.Shape().Dim(1)
	return loss.CrossEntropy(engine.SliceAxis(logits, 1, 0, n-1), engine.SliceAxis(labels, 1, 1, n), loss.IgnoreIndex)
}

// Folded returns the norm tensors removed by folding.
func (m Llama) Folded() models.Params { return m.Model.Folded }

// ConfigJSON returns the model's config.json.
func (m Llama) ConfigJSON() ([]byte, error) { return m.Config.JSON() }

func toF32(x *graph.Node) *graph.Node {
	if x.DType().IsFloat() && x.DType().Size() < 4 {
		return graph.ConvertDType(x, dtypes.Float32)
	}
	return x
}
