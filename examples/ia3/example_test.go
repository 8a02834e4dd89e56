package ia3_test

import (
	"context"
	"log"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/examples/ia3"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models/decoder"
)

// Example trains (IA)³ on a LLaMA checkpoint with the standard trainer, exports it as a PEFT adapter and as a
// merged checkpoint, reads the adapter back, and resumes the run from its last checkpoint: the flow of
// docs/adapters.md (compiled, not run: it needs a model folder and data).
func Example() {
	backend, err := engine.NewBackend(engine.DefaultBackend)
	if err != nil {
		log.Fatal(err)
	}
	m, err := llama.Load("llama-folder", decoder.Options{})
	if err != nil {
		log.Fatal(err)
	}
	model := lm.Model{Model: m, Spec: llama.Spec}
	var data finetune.Examples // input_ids, attention_mask, labels

	// The adapters: IA3 on keys, values and the MLP's down projection, which it scales on the input.
	newAdapter, err := ia3.New(ia3.Config{FeedForward: []string{"mlp.down_proj"}})
	if err != nil {
		log.Fatal(err)
	}
	targets := []string{"k", "v", "down"}
	set, err := adapter.NewSet(model.LinearLayers(), targets, newAdapter, 1, finetune.BaseWeights(model))
	if err != nil {
		log.Fatal(err)
	}

	// Train: method custom, no LoRA settings; the adapters come from WithAdapters.
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRATarget = finetune.MethodCustom, 0, nil
	cfg.Steps, cfg.LR, cfg.CheckpointEvery = 200, 3e-3, 50
	tr, err := finetune.New(model, cfg, backend, finetune.WithAdapters(set))
	if err != nil {
		log.Fatal(err)
	}
	loader, err := finetune.NewLoader(data, cfg.BatchSize, cfg.Seed, true)
	if err != nil {
		log.Fatal(err)
	}
	if err := tr.Fit(context.Background(), loader, "out", nil, finetune.Hooks{}); err != nil {
		log.Fatal(err)
	}

	// Export: a PEFT adapter folder (peft's PeftModel.from_pretrained reads it) and a merged checkpoint.
	if err := tr.ExportAdapter("out/adapter", "meta-llama/Llama-2-7b-hf"); err != nil {
		log.Fatal(err)
	}
	if err := tr.ExportMerged("out/merged"); err != nil {
		log.Fatal(err)
	}

	// Import: the format registered by package ia3 reads the folder into adapters for the model.
	imported, err := finetune.ReadAdapter("out/adapter", model)
	if err != nil {
		log.Fatal(err)
	}
	_ = finetune.NewLogitsRunner(backend, model, nil, imported.Set)

	// Resume: the same adapters, built again the same way (their trained tensors come from the checkpoint).
	again, err := adapter.NewSet(model.LinearLayers(), targets, newAdapter, 1, finetune.BaseWeights(model))
	if err != nil {
		log.Fatal(err)
	}
	loader2, err := finetune.NewLoader(data, cfg.BatchSize, cfg.Seed, true)
	if err != nil {
		log.Fatal(err)
	}
	resumed, err := finetune.Resume("out", model, backend, loader2, finetune.WithAdapters(again))
	if err != nil {
		log.Fatal(err)
	}
	if err := resumed.Fit(context.Background(), loader2, "out", nil, finetune.Hooks{}); err != nil {
		log.Fatal(err)
	}
}
