package finetune

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/safetensors"
)

// Logits computes model's logits on batch with the given parameters (model.Params() when nil) and adapters
// (none when set is nil).
func Logits(backend backends.Backend, model Model, params models.Params, set *lora.Set, batch Batch) (*tensors.Tensor, error) {
	if params == nil {
		params = model.Params()
	}
	var out *tensors.Tensor
	err := engine.Try(func() {
		g := graph.NewGraph(backend, "logits")
		names := sortedKeys(batch)
		nodes := map[string]*graph.Node{}
		args := []any{}
		for _, n := range names {
			nodes[n] = graph.Parameter(g, "batch."+n, batch[n].Shape())
			args = append(args, batch[n])
		}
		b := models.Bind(g, params)
		for _, t := range b.Inputs(params) {
			args = append(args, t)
		}
		if set != nil {
			ad := models.Bind(g, set.Params)
			b = b.Merge(ad)
			b.Linear = set.Hook()
			for _, t := range ad.Inputs(set.Params) {
				args = append(args, t)
			}
		}
		logits := model.Logits(b, nodes)
		g.Compile(logits)
		out = g.Run(args...)[0]
	})
	return out, err
}

// Logits computes the trained model's logits on batch (current trainable tensors and adapters).
func (t *Trainer) Logits(batch Batch) (*tensors.Tensor, error) {
	params := models.Params{}
	for n, v := range t.Model.Params() {
		params[n] = v
	}
	var set *lora.Set
	if t.Adapters != nil {
		set = &lora.Set{Layers: t.Adapters.Layers, Adapters: t.Adapters.Adapters, Params: models.Params{}}
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
	return Logits(t.Backend, t.Model, params, set, batch)
}

// ImportModules reads the modules_to_save tensors of a PEFT adapter folder: base parameters by name (without
// the "base_model.model." prefix).
func ImportModules(dir string) (models.Params, error) {
	if _, err := os.Stat(filepath.Join(dir, AdapterWeights)); err != nil {
		return nil, err
	}
	f, err := safetensors.Open(filepath.Join(dir, AdapterWeights))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := models.Params{}
	for _, key := range f.Names() {
		if strings.Contains(key, ".lora_") {
			continue
		}
		if !strings.HasPrefix(key, peftPrefix) {
			return nil, fmt.Errorf("%s: key %q does not start with %q", dir, key, peftPrefix)
		}
		if out[key[len(peftPrefix):]], err = f.TensorAs(key, dtypes.Float32); err != nil {
			return nil, err
		}
	}
	return out, nil
}
