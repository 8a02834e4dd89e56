package finetune

import (
	"fmt"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/runner"
)

// Logits computes model's logits on batch with the given parameters (model.Params() when nil) and adapters
// (none when set is nil): runner.Logits.
func Logits(backend compute.Backend, model Model, params models.Params, set *adapter.Set, batch Batch) (*tensors.Tensor, error) {
	return runner.Logits(backend, model, params, set, batch)
}

// Loss computes model's loss on batch (it must hold the labels) with the given parameters and adapters, as
// Logits does.
func Loss(backend compute.Backend, model Model, params models.Params, set *adapter.Set, batch Batch) (float64, error) {
	out, err := runner.Output(backend, model, params, set, batch, func(b models.Bound, nodes map[string]*graph.Node) *graph.Node {
		return graph.ConvertDType(model.Loss(b, nodes), dtypes.Float32)
	})
	if err != nil {
		return 0, err
	}
	defer out.MustFinalizeAll()
	var loss float64
	err = tensors.ConstFlatData[float32](out, func(f []float32) { loss = float64(f[0]) })
	return loss, err
}

// Logits computes the trained model's logits on batch (current trainable tensors and adapters).
func (t *Trainer) Logits(batch Batch) (*tensors.Tensor, error) {
	params, set := t.Current()
	return Logits(t.Backend, t.Model, params, set, batch)
}

// MeanLoss returns the trained model's loss averaged over data's examples, evaluated in consecutive batches of
// batchSize (the last may be shorter); each batch's loss (a mean over its examples or tokens) weighs by its
// number of examples.
func (t *Trainer) MeanLoss(data Examples, batchSize int) (float64, error) {
	params, set := t.Current()
	n := data.Len()
	if n == 0 || batchSize <= 0 {
		return 0, fmt.Errorf("mean loss needs examples and a positive batch size (got %d, %d)", n, batchSize)
	}
	var sum float64
	for start := 0; start < n; start += batchSize {
		idx := make([]int, 0, batchSize)
		for i := start; i < min(n, start+batchSize); i++ {
			idx = append(idx, i)
		}
		batch := Batch{}
		for name, tt := range data {
			g, err := gatherRows(tt, idx)
			if err != nil {
				return 0, err
			}
			batch[name] = g
		}
		loss, err := Loss(t.Backend, t.Model, params, set, batch)
		for _, tt := range batch {
			tt.MustFinalizeAll()
		}
		if err != nil {
			return 0, err
		}
		sum += loss * float64(len(idx))
	}
	return sum / float64(n), nil
}

// Current returns the model parameters with the trained tensors in place, and the adapters with theirs.
func (t *Trainer) Current() (models.Params, *adapter.Set) {
	params := models.Params{}
	for n, v := range t.Model.Params() {
		params[n] = v
	}
	var set *adapter.Set
	if t.Adapters != nil {
		set = &adapter.Set{Layers: t.Adapters.Layers, Adapters: t.Adapters.Adapters, Params: models.Params{}}
	}
	for n, v := range t.Train {
		if set != nil {
			if _, ok := t.Adapters.Params[n]; ok {
				set.Params[n] = v
				continue
			}
		}
		params[n] = v
	}
	if set != nil {
		for n, v := range t.Adapters.Params {
			if _, ok := set.Params[n]; !ok {
				set.Params[n] = v
			}
		}
	}
	return params, set
}

// LogitsRunner computes a model's logits with fixed parameters and adapters, reusing one compiled graph per
// batch signature: runner.LogitsRunner.
type LogitsRunner = runner.LogitsRunner

// NewLogitsRunner returns a runner over model with params (model.Params() when nil) and adapters (none when set
// is nil): runner.NewLogitsRunner.
func NewLogitsRunner(backend compute.Backend, model Model, params models.Params, set *adapter.Set) *LogitsRunner {
	return runner.NewLogitsRunner(backend, model, params, set)
}
