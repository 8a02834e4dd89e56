package pretrained

import (
	"context"
	"encoding/json"
	"fmt"
	_ "github.com/memfit/memfit/family/all" // the shipped model families register themselves
	"os"
	"path/filepath"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
)

// FashionClasses are Fashion-MNIST's class names by label.
var FashionClasses = []string{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"}

// Fashion-MNIST's pixel statistics (training set, after scaling to [0, 1]), the shipped ViT's normalisation.
const (
	FashionMean = 0.2860
	FashionStd  = 0.3530
)

// IDX is data.IDX (kept here for the callers of this package).
type IDX = data.IDX

// ReadIDX reads an IDX file (data.ReadIDX).
func ReadIDX(path string) (*IDX, error) { return data.ReadIDX(path) }

// DecodeIDX decodes IDX bytes (data.DecodeIDX).
func DecodeIDX(raw []byte) (*IDX, error) { return data.DecodeIDX(raw) }

// WriteIDX writes x as a gzip-compressed IDX file, atomically.
func WriteIDX(path string, x *IDX) error { return writeFile(path, x.Encode()) }

// Subset picks, from an IDX image file and its label file, the first perClass images of each class in classes
// (in file order) and returns them in file order; perClass 0 takes them all.
func Subset(images, labels *IDX, classes []int, perClass int) (*IDX, *IDX, error) {
	if len(images.Dims) != 3 || len(labels.Dims) != 1 || images.Dims[0] != labels.Dims[0] {
		return nil, nil, fmt.Errorf("images %v and labels %v do not pair up", images.Dims, labels.Dims)
	}
	px := images.Dims[1] * images.Dims[2]
	want := map[int]int{}
	for _, c := range classes {
		want[c] = perClass
	}
	outI := &IDX{Dims: []int{0, images.Dims[1], images.Dims[2]}}
	outL := &IDX{Dims: []int{0}}
	for i, l := range labels.Data {
		left, ok := want[int(l)]
		if !ok || (perClass > 0 && left == 0) {
			continue
		}
		want[int(l)] = left - 1
		outI.Data = append(outI.Data, images.Data[i*px:(i+1)*px]...)
		outL.Data = append(outL.Data, l)
	}
	outI.Dims[0], outL.Dims[0] = len(outL.Data), len(outL.Data)
	return outI, outL, nil
}

// FashionExamples turns IDX images and labels into ViT examples: pixel_values [N, 1, H, W] scaled to [0, 1] and
// normalised with FashionMean/FashionStd, labels [N] int32 minus labelOffset (so classes 5-9 become 0-4).
func FashionExamples(images, labels *IDX, labelOffset int) (finetune.Examples, error) {
	if len(images.Dims) != 3 || len(labels.Dims) != 1 || images.Dims[0] != labels.Dims[0] {
		return nil, fmt.Errorf("images %v and labels %v do not pair up", images.Dims, labels.Dims)
	}
	n, h, w := images.Dims[0], images.Dims[1], images.Dims[2]
	px := make([]float32, len(images.Data))
	for i, v := range images.Data {
		px[i] = (float32(v)/255 - FashionMean) / FashionStd
	}
	lb := make([]int32, n)
	for i, v := range labels.Data {
		lb[i] = int32(int(v) - labelOffset)
	}
	return finetune.Examples{"pixel_values": tensors.FromFlatDataAndDimensions(px, n, 1, h, w),
		"labels": tensors.FromFlatDataAndDimensions(lb, n)}, nil
}

// ViTConfig is the shipped ViT's architecture: 28x28 grey images in 7x7 patches (16 patches + CLS), hidden 64,
// 4 layers of 4 heads, MLP 256, classifying Fashion-MNIST classes 0-4.
func ViTConfig() vit.Config {
	return vit.Config{HiddenSize: 64, NumHiddenLayers: 4, NumAttentionHeads: 4, IntermediateSize: 256, LayerNormEps: 1e-12,
		ImageSize: 28, PatchSize: 7, NumChannels: 1, QKVBias: true, Architecture: vit.ArchClassification,
		Labels: append([]string(nil), FashionClasses[:5]...)}
}

// PretrainViTOptions configure PretrainViT.
type PretrainViTOptions struct {
	Steps, BatchSize int
	LR               float64
	Seed             uint64
	// OnStep sees every step (progress).
	OnStep func(finetune.StepStats)
}

// PretrainViT trains ViTConfig from random initialisation (seed) on the Fashion-MNIST training images of
// classes 0-4 (full fine-tuning: AdamW, cosine schedule with 10% warm-up, weight decay 0.05) and writes the
// model to out as a Hugging Face folder (config.json, model.safetensors, preprocessor_config.json), returning
// its accuracy on the test images of classes 0-4.
func PretrainViT(ctx context.Context, backend compute.Backend, trainImages, trainLabels, testImages, testLabels, out string, o PretrainViTOptions) (float64, error) {
	load := func(imgPath, labPath string) (finetune.Examples, error) {
		imgs, err := ReadIDX(imgPath)
		if err != nil {
			return nil, err
		}
		labs, err := ReadIDX(labPath)
		if err != nil {
			return nil, err
		}
		si, sl, err := Subset(imgs, labs, []int{0, 1, 2, 3, 4}, 0)
		if err != nil {
			return nil, err
		}
		return FashionExamples(si, sl, 0)
	}
	train, err := load(trainImages, trainLabels)
	if err != nil {
		return 0, err
	}
	test, err := load(testImages, testLabels)
	if err != nil {
		return 0, err
	}
	c := ViTConfig()
	cj, err := c.JSON()
	if err != nil {
		return 0, err
	}
	initDir, err := os.MkdirTemp("", "memfit-vit-init-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(initDir)
	if err := models.SaveCheckpoint(initDir, cj, vit.RandomParams(c, o.Seed), 0); err != nil {
		return 0, err
	}
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRATarget = finetune.MethodFull, 0, nil
	cfg.LR, cfg.Steps, cfg.BatchSize, cfg.Seed = o.LR, o.Steps, o.BatchSize, o.Seed
	cfg.Schedule, cfg.WarmupSteps, cfg.WeightDecay = "cosine", o.Steps/10, 0.05
	loader, err := finetune.NewLoader(train, cfg.BatchSize, cfg.Seed, true)
	if err != nil {
		return 0, err
	}
	res, err := finetune.Recipe{Spec: finetune.RunSpec{Model: initDir, Config: cfg}, Data: loader, Backend: backend,
		Hooks: finetune.RunHooks{Hooks: finetune.Hooks{OnStep: o.OnStep}}}.Run(ctx)
	if err != nil {
		return 0, err
	}
	tr := res.Trainer
	acc, err := finetune.Accuracy(tr.Logits, test, 500)
	if err != nil {
		return 0, err
	}
	params := models.Params{}
	for n, v := range tr.Train {
		params[n] = v
	}
	if err := models.SaveCheckpoint(out, cj, params, 0); err != nil {
		return 0, err
	}
	pre, _ := json.MarshalIndent(map[string]any{
		"image_processor_type": "ViTImageProcessor", "do_resize": false, "size": map[string]int{"height": 28, "width": 28},
		"resample": 2, "do_rescale": true, "rescale_factor": 1.0 / 255, "do_normalize": true,
		"image_mean": []float64{FashionMean}, "image_std": []float64{FashionStd}}, "", "  ")
	return acc, writeFile(filepath.Join(out, "preprocessor_config.json"), append(pre, '\n'))
}
