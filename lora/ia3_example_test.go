package lora_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
)

// IA3 is the example custom adapter of docs/adapters.md, written only against the public lora.Adapter
// interface: (IA)³ rescales a layer's output by a learned vector, y = (W x + b) ∘ l, with l starting at ones.
type IA3 struct{}

// Type is PEFT's name for it.
func (IA3) Type() string { return "IA3" }

// Init creates l = ones [out].
func (IA3) Init(layer models.LinearLayer, _ *rand.Rand) (map[string]*tensors.Tensor, error) {
	ones := make([]float32, layer.Out)
	for i := range ones {
		ones[i] = 1
	}
	return map[string]*tensors.Tensor{"ia3_l": tensors.FromFlatDataAndDimensions(ones, layer.Out)}, nil
}

// Trainable: l trains.
func (IA3) Trainable(string) bool { return true }

// Forward scales the base layer's output. Its backward keeps the base output (for l's gradient) and l.
func (IA3) Forward(_ lora.Context, _ models.LinearLayer, x, weight, bias *graph.Node, p map[string]*graph.Node) *graph.Node {
	y := engine.Linear(x, weight, bias)
	return graph.Mul(y, graph.ExpandLeftToRank(p["ia3_l"], y.Rank()))
}

// Settings are the adapter_config.json fields.
func (IA3) Settings() map[string]any { return map[string]any{"peft_type": "IA3"} }

// TestCustomAdapterTrains plugs IA3 into a ViT's key, value and MLP output layers without touching memfit, and
// trains it with the standard trainer: it starts as the base model and its loss falls.
func TestCustomAdapterTrains(t *testing.T) {
	cfg, _ := vit.Preset("tiny", 3)
	m, err := vit.New(cfg, vit.RandomParams(cfg, 1), vit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set, err := lora.NewSet(vit.LinearLayers(cfg), []string{"k", "v", "down"}, func(models.LinearLayer) lora.Adapter { return IA3{} }, 1)
	if err != nil {
		t.Fatal(err)
	}
	tc := finetune.Defaults()
	tc.Method, tc.LoRARank, tc.LoRATarget, tc.TrainModules, tc.Steps, tc.LR = finetune.MethodCustom, 0, nil, []string{"classifier"}, 20, 1e-2
	tc.LogEvery = 1 // Fit reads the loss back at logging steps: every step here
	tr, err := finetune.New(finetune.ViT{Model: m}, tc, gtest.Backend(t), finetune.WithAdapters(set))
	if err != nil {
		t.Fatal(err)
	}
	px := gtest.Rand(3, 12*3*32*32, 1)
	labels := make([]int32, 12)
	for i := range labels {
		labels[i] = int32(i % 3)
		for k := 0; k < 1024; k++ {
			px[(i*3+i%3)*1024+k] += 1
		}
	}
	data := finetune.Examples{"pixel_values": tensors.FromFlatDataAndDimensions(px, 12, 3, 32, 32),
		"labels": tensors.FromFlatDataAndDimensions(labels, 12)}
	loader, _ := finetune.NewLoader(data, 6, 1, true)
	batch, _ := loader.Next()
	before, _ := tr.Logits(batch)
	base, _ := finetune.Logits(gtest.Backend(t), finetune.ViT{Model: m}, nil, nil, batch)
	if d := gtest.MaxAbsDiff(gtest.Float32s(before), gtest.Float32s(base)); d != 0 {
		t.Errorf("IA3 with l = 1 changes the logits by %g", d)
	}
	var losses []float64
	err = tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{OnStep: func(s finetune.StepStats) {
		if s.Synced {
			losses = append(losses, s.Loss)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if losses[len(losses)-1] > 0.7*losses[0] {
		t.Errorf("IA3 loss %.3f -> %.3f", losses[0], losses[len(losses)-1])
	}
}
