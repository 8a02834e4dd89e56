package finetune

import (
	"fmt"
	"slices"
	"sort"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
)

// What trains. The trainer (New) and the memory planner (PlanStep) both ask SplitTrainable, so the tensors a
// plan counts as trained and frozen are the ones a run trains and freezes.

// newAdapters returns the adapter constructor of cfg's method (lora, lora-fa, qlora); nil for full fine-tuning
// and custom adapters.
func newAdapters(cfg Config) (func(models.LinearLayer) adapter.Adapter, error) {
	if cfg.Method == MethodFull || cfg.Method == MethodCustom {
		return nil, nil
	}
	return lora.New(lora.Config{Rank: cfg.LoRARank, Alpha: cfg.LoRAAlpha, RSLoRA: cfg.RSLoRA,
		FrozenA: cfg.Method == MethodLoRAFA, Dropout: cfg.LoRADropout})
}

// trainsModule reports whether parameter name lies under the module path prefix.
func trainsModule(prefix, name string) bool {
	return name == prefix || len(name) > len(prefix) && name[:len(prefix)] == prefix && name[len(prefix)] == '.'
}

// SplitTrainable decides which tensors of a run train: of the base parameters (by name; NF4-quantised ones as
// their NF4 tensors' names), every one for full fine-tuning, otherwise those under cfg.TrainModules; of the
// adapters' tensors (set, nil without adapters), those the adapters mark trainable. Everything else is frozen.
// Both lists are sorted. It is an error for a train_modules prefix to match no base parameter, or to name an
// NF4-quantised weight (its codes cannot train).
func SplitTrainable(cfg Config, base []string, set *adapter.Set) (train, frozen []string, err error) {
	for _, prefix := range cfg.TrainModules {
		if !slices.ContainsFunc(base, func(name string) bool { return trainsModule(prefix, name) }) {
			return nil, nil, fmt.Errorf("train_modules: no parameter of the model starts with %q", prefix)
		}
	}
	for _, name := range base {
		trains := cfg.Method == MethodFull || slices.ContainsFunc(cfg.TrainModules, func(p string) bool { return trainsModule(p, name) })
		switch {
		case trains && isNF4(name):
			return nil, nil, fmt.Errorf("parameter %q is NF4-quantised and cannot train (train_modules must name float modules)", name)
		case trains:
			train = append(train, name)
		default:
			frozen = append(frozen, name)
		}
	}
	if set != nil {
		trainable := set.Trainable()
		for name := range set.Params {
			if slices.Contains(trainable, name) {
				train = append(train, name)
			} else {
				frozen = append(frozen, name)
			}
		}
	}
	if len(train) == 0 {
		return nil, nil, fmt.Errorf("nothing to train: no trainable parameter")
	}
	sort.Strings(train)
	sort.Strings(frozen)
	return train, frozen, nil
}
