package plan_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	vitfam "github.com/memfit/memfit/family/vit"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models/vit"
)

// imageTask returns a tiny ViT classifier and a synthetic 3-class image set (class c = channel c brighter), as
// finetune's tests make them.
func imageTask(t *testing.T, opts vit.Options) (finetune.Model, finetune.Examples) {
	cfg, err := vit.Preset("tiny", 3)
	if err != nil {
		t.Fatal(err)
	}
	m, err := vit.New(cfg, vit.RandomParams(cfg, 1), opts)
	if err != nil {
		t.Fatal(err)
	}
	const n = 24
	r := rand.New(rand.NewPCG(5, 6))
	px := make([]float32, n*3*32*32)
	labels := make([]int32, n)
	for i := 0; i < n; i++ {
		c := i % 3
		labels[i] = int32(c)
		for ch := 0; ch < 3; ch++ {
			for k := 0; k < 32*32; k++ {
				v := float32(r.NormFloat64() * 0.3)
				if ch == c {
					v += 1
				}
				px[(i*3+ch)*1024+k] = v
			}
		}
	}
	return vitfam.Model{Model: m}, finetune.Examples{
		"pixel_values": tensors.FromFlatDataAndDimensions(px, n, 3, 32, 32),
		"labels":       tensors.FromFlatDataAndDimensions(labels, n),
	}
}

// config is a training config of method for steps steps, as finetune's tests make it.
func config(method string, steps int) finetune.Config {
	c := finetune.Defaults()
	c.Method = method
	c.Steps = steps
	c.LR = 3e-3
	c.LoRATarget = []string{"all-linear"}
	c.LogEvery = 1
	if method == finetune.MethodFull {
		c.LoRARank, c.LoRATarget, c.LR = 0, nil, 1e-3
	}
	return c
}
