package main

import (
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
)

func readIDX(path string) ([]int, []byte) {
	f, _ := os.Open(path)
	z, _ := gzip.NewReader(f)
	b, _ := io.ReadAll(z)
	nd := int(b[3])
	dims := make([]int, nd)
	for i := range dims {
		dims[i] = int(binary.BigEndian.Uint32(b[4+4*i:]))
	}
	return dims, b[4+4*nd:]
}

func main() {
	_, imgs := readIDX("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
	_, labs := readIDX("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz")
	var px []float32
	var lb []int32
	for i, l := range labs {
		if l < 5 && len(lb) < 20000 {
			for _, v := range imgs[i*784 : (i+1)*784] {
				px = append(px, (float32(v)/255-0.286)/0.353)
			}
			lb = append(lb, int32(l))
		}
	}
	n := len(lb)
	ex := finetune.Examples{"pixel_values": tensors.FromFlatDataAndDimensions(px, n, 1, 28, 28), "labels": tensors.FromFlatDataAndDimensions(lb, n)}
	c := vit.Config{HiddenSize: 64, NumHiddenLayers: 4, NumAttentionHeads: 4, IntermediateSize: 256, LayerNormEps: 1e-12,
		ImageSize: 28, PatchSize: 7, NumChannels: 1, QKVBias: true, Architecture: vit.ArchClassification,
		Labels: []string{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"}}
	dir := "/tmp/vitpre-init"
	cj, _ := c.JSON()
	if err := models.SaveCheckpoint(dir, cj, vit.RandomParams(c, 1), 0); err != nil {
		panic(err)
	}
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRATarget = "full", 0, nil
	cfg.LR, cfg.Steps, cfg.BatchSize, cfg.Schedule, cfg.WarmupSteps, cfg.WeightDecay = 1e-3, 300, 64, "cosine", 30, 0.05
	model, err := finetune.LoadModel(dir, cfg)
	if err != nil {
		panic(err)
	}
	be, _ := engine.NewBackend(engine.ChooseSpec(""))
	tr, err := finetune.New(model, cfg, be)
	if err != nil {
		panic(err)
	}
	ld, _ := finetune.NewLoader(ex, 64, 1, true)
	start := time.Now()
	err = tr.Fit(context.Background(), ld, "", nil, finetune.Hooks{OnStep: func(s finetune.StepStats) {
		if s.Step%25 == 0 {
			fmt.Printf("step %d loss %.4f %.0f img/s %.1fs\n", s.Step, s.Loss, s.ExamplesPerSecond, time.Since(start).Seconds())
		}
	}})
	if err != nil {
		panic(err)
	}
	test := finetune.Examples{}
	for k, v := range ex {
		test[k] = v
	}
	acc, err := finetune.Accuracy(tr.Logits, ex, 500)
	fmt.Println("train acc", acc, err)
}
