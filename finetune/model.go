// Package finetune trains models: the recipe of a whole run (Recipe: output folder, model and data, trainer,
// checkpoints, export), the training step (loss, gradients, optimizer) and the loop (schedules, accumulation,
// clipping, logging, NaN checks), checkpoints with exact resume, export to PEFT adapters, merged Hugging Face
// checkpoints and GGUF, the data formats, and the registry of the model families it trains (Family: each family's
// package registers itself; family/all imports the shipped ones). The memory planner and autopilot are package
// plan, above this one.
package finetune

import (
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/models"
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
