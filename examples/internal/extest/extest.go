// Package extest holds the checks the example adapters' tests share, written against memfit's public API as a
// user's tests would be: a tiny ViT and its data, training a custom adapter set with the standard trainer, the
// PEFT export read back into a fresh model, the merged export loaded by the stock model code, and an exact
// resume.
package extest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	vitfam "github.com/memfit/memfit/family/vit"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/adaptertest"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/safetensors"
)

// ViT returns the tiny ViT classifier (3 labels) with base seed 1 and random (non-zero) linear biases, loaded
// with opts; with randomNorms its LayerNorms get weights near 1 and non-zero biases, so MS-norm's change of basis
// is not the identity (otherwise they are the identity).
func ViT(t testing.TB, opts vit.Options, randomNorms bool) vitfam.Model {
	t.Helper()
	cfg, err := vit.Preset("tiny", 3)
	if err != nil {
		t.Fatal(err)
	}
	p := vit.RandomParams(cfg, 1)
	for i, name := range p.Names() {
		dims := p[name].Shape().Dimensions
		norm := strings.Contains(name, "layernorm")
		switch {
		case norm && !randomNorms:
		case norm:
			v := gtest.Rand(uint64(100+i), p[name].Shape().Size(), 0.2)
			if strings.HasSuffix(name, ".weight") {
				for j := range v {
					v[j]++
				}
			}
			p[name] = tensors.FromFlatDataAndDimensions(v, dims...)
		case strings.HasSuffix(name, ".bias") && len(dims) == 1:
			p[name] = tensors.FromFlatDataAndDimensions(gtest.Rand(uint64(200+i), dims[0], 0.05), dims...)
		}
	}
	m, err := vit.New(cfg, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	return vitfam.Model{Model: m}
}

// LoadViT loads a ViT checkpoint folder with the stock model code (no options).
func LoadViT(dir string) (finetune.Model, error) {
	m, err := vit.Load(dir, vit.Options{})
	if err != nil {
		return nil, err
	}
	return vitfam.Model{Model: m}, nil
}

// Llama returns the tiny LLaMA causal LM with base seed 2, loaded with opts; with randomNorms its RMSNorm
// weights are near 1 instead of 1, so MS-norm's change of basis is a scaling (RMSNorm has no shift).
func Llama(t testing.TB, opts decoder.Options, randomNorms bool) lm.Model {
	t.Helper()
	cfg, err := llama.Preset("tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	p := decoder.RandomParams(cfg, 2)
	for i, name := range p.Names() {
		if randomNorms && strings.HasSuffix(name, "norm.weight") {
			v := gtest.Rand(uint64(300+i), p[name].Shape().Size(), 0.2)
			for j := range v {
				v[j]++
			}
			p[name] = tensors.FromFlatDataAndDimensions(v, p[name].Shape().Dimensions...)
		}
	}
	m, err := decoder.New(cfg, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	return lm.Model{Model: m, Spec: llama.Spec}
}

// LoadLlama loads a LLaMA checkpoint folder with the stock model code (no options).
func LoadLlama(dir string) (finetune.Model, error) {
	m, err := llama.Load(dir, decoder.Options{})
	if err != nil {
		return nil, err
	}
	return lm.Model{Model: m, Spec: llama.Spec}, nil
}

// Text returns 16 sequences of 12 tokens following t[i+1] = (5 t[i] + 3) mod 64.
func Text() finetune.Examples {
	const n, seq = 16, 12
	ids := make([]int32, n*seq)
	mask := make([]int32, n*seq)
	for i := 0; i < n; i++ {
		tok := int32(i*3 + 1)
		for j := 0; j < seq; j++ {
			ids[i*seq+j], mask[i*seq+j] = tok, 1
			tok = (5*tok + 3) % 64
		}
	}
	return finetune.Examples{"input_ids": tensors.FromFlatDataAndDimensions(ids, n, seq),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, n, seq),
		"labels":         tensors.FromFlatDataAndDimensions(append([]int32(nil), ids...), n, seq)}
}

// Images returns 24 32×32 images of 3 classes, class c brighter in channel c.
func Images() finetune.Examples {
	const n = 24
	r := rand.New(rand.NewPCG(5, 6))
	px := make([]float32, n*3*32*32)
	labels := make([]int32, n)
	for i := 0; i < n; i++ {
		labels[i] = int32(i % 3)
		for ch := 0; ch < 3; ch++ {
			for k := 0; k < 32*32; k++ {
				v := float32(r.NormFloat64() * 0.3)
				if ch == i%3 {
					v++
				}
				px[(i*3+ch)*1024+k] = v
			}
		}
	}
	return finetune.Examples{"pixel_values": tensors.FromFlatDataAndDimensions(px, n, 3, 32, 32),
		"labels": tensors.FromFlatDataAndDimensions(labels, n)}
}

// Config returns a run of custom adapters (method custom, no LoRA settings) of steps AdamW steps at lr, the
// classifier head training next to the adapters, every step's loss read back.
func Config(steps int, lr float64) finetune.Config {
	c := finetune.Defaults()
	c.Method, c.LoRARank, c.LoRATarget = finetune.MethodCustom, 0, nil
	c.TrainModules = []string{"classifier"}
	c.Steps, c.LR, c.LogEvery, c.Seed = steps, lr, 1, 3
	return c
}

// NewSet builds the adapter set of model for targets with newAdapter (seed 7), as a user does.
func NewSet(t testing.TB, model finetune.Model, targets []string, newAdapter func(models.LinearLayer) adapter.Adapter) *adapter.Set {
	t.Helper()
	set, err := adapter.NewSet(model.LinearLayers(), targets, newAdapter, 7, finetune.BaseWeights(model))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// Fit trains set on model with cfg over data (batches of 6) and returns every step's loss and the trainer;
// outDir "" writes no checkpoint.
func Fit(t testing.TB, model finetune.Model, cfg finetune.Config, set *adapter.Set, data finetune.Examples, outDir string) ([]float64, *finetune.Trainer) {
	t.Helper()
	tr, err := finetune.New(model, cfg, gtest.Backend(t), finetune.WithAdapters(set))
	if err != nil {
		t.Fatal(err)
	}
	loader, err := finetune.NewLoader(data, 6, cfg.Seed, true)
	if err != nil {
		t.Fatal(err)
	}
	var losses []float64
	err = tr.Fit(context.Background(), loader, outDir, nil, finetune.Hooks{OnStep: func(s finetune.StepStats) {
		if !s.Synced {
			t.Errorf("step %d: loss not read back (LogEvery 1)", s.Step)
		}
		losses = append(losses, s.Loss)
	}})
	if err != nil {
		t.Fatal(err)
	}
	return losses, tr
}

// Batch returns the first n examples of data (float32 or int32 inputs), without labels.
func Batch(t testing.TB, data finetune.Examples, n int) finetune.Batch {
	t.Helper()
	b := finetune.Batch{}
	for name, v := range data {
		if name == "labels" {
			continue
		}
		dims := append([]int{n}, v.Shape().Dimensions[1:]...)
		per := v.Shape().Size() / v.Shape().Dimensions[0]
		v.MustConstFlatData(func(flat any) {
			switch f := flat.(type) {
			case []float32:
				b[name] = tensors.FromFlatDataAndDimensions(append([]float32(nil), f[:n*per]...), dims...)
			case []int32:
				b[name] = tensors.FromFlatDataAndDimensions(append([]int32(nil), f[:n*per]...), dims...)
			default:
				t.Fatalf("Batch: %s has dtype %s", name, v.DType())
			}
		})
	}
	return b
}

// Logits returns the trainer's logits on batch.
func Logits(t testing.TB, tr *finetune.Trainer, batch finetune.Batch) []float32 {
	t.Helper()
	out, err := tr.Logits(batch)
	if err != nil {
		t.Fatal(err)
	}
	return gtest.Float32s(out)
}

// CheckImport exports tr's adapters in PEFT's format to dir, reads them into fresh (a model loaded anew, without
// the trainer's tensors) with finetune.ReadAdapter, and checks that its logits on batch equal the trainer's
// within tol (relative, floor 1).
func CheckImport(t testing.TB, tr *finetune.Trainer, fresh finetune.Model, dir string, batch finetune.Batch, tol float64) {
	t.Helper()
	if err := tr.ExportAdapter(dir, "memfit/tiny"); err != nil {
		t.Fatal(err)
	}
	d := gtest.MaxRelDiff(adaptertest.Logits(t, fresh, dir, batch), Logits(t, tr, batch), 1)
	t.Logf("PEFT adapter read into a fresh model: logits differ by %g", d)
	if d > tol {
		t.Errorf("PEFT adapter read into a fresh model: logits differ by %g (relative), want <= %g", d, tol)
	}
}

// CheckMerged writes tr's merged checkpoint, loads it with the stock model code (load: LoadViT, LoadLlama) and
// checks its logits on batch equal the trainer's within tol.
func CheckMerged(t testing.TB, tr *finetune.Trainer, load func(dir string) (finetune.Model, error), dir string, batch finetune.Batch, tol float64) {
	t.Helper()
	if err := tr.ExportMerged(dir); err != nil {
		t.Fatal(err)
	}
	merged, err := load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := finetune.Logits(gtest.Backend(t), merged, nil, nil, batch)
	if err != nil {
		t.Fatal(err)
	}
	d := gtest.MaxRelDiff(gtest.Float32s(got), Logits(t, tr, batch), 1)
	t.Logf("merged checkpoint: logits differ by %g", d)
	if d > tol {
		t.Errorf("merged checkpoint: logits differ by %g (relative), want <= %g", d, tol)
	}
}

// Shapes returns the tensor names and shapes of a safetensors file, and checks that every tensor is float32
// and the metadata says format "pt" (as PEFT's files).
func Shapes(t testing.TB, path string) map[string][]int {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata()["format"] != "pt" {
		t.Errorf("%s: metadata %v, want format pt", path, f.Metadata())
	}
	out := map[string][]int{}
	for _, n := range f.Names() {
		info, _ := f.Info(n)
		if fmt.Sprint(info.DType) != "F32" {
			t.Errorf("%s: %s is %v, want F32", path, n, info.DType)
		}
		out[n] = info.Shape
	}
	return out
}

// JSON reads a JSON object.
func JSON(t testing.TB, path string) map[string]any {
	t.Helper()
	raw, err := readfile.Read(path, readfile.Data)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// CheckConfig checks that the adapter_config.json in dir holds want's fields (compared as JSON values) and the
// common keys export writes.
func CheckConfig(t testing.TB, dir string, want map[string]any) map[string]any {
	t.Helper()
	got := JSON(t, filepath.Join(dir, finetune.AdapterConfig))
	for k, v := range want {
		raw, _ := json.Marshal(v)
		var norm any
		_ = json.Unmarshal(raw, &norm)
		if fmt.Sprint(got[k]) != fmt.Sprint(norm) {
			t.Errorf("adapter_config.json %s = %v, want %v", k, got[k], norm)
		}
	}
	for _, k := range []string{adapter.KeyTargets, adapter.KeyBaseModel, adapter.KeyModulesToSave, adapter.KeyTaskType, "inference_mode"} {
		if _, ok := got[k]; !ok {
			t.Errorf("adapter_config.json lacks %q", k)
		}
	}
	return got
}

// CheckResume trains cfg.Steps steps in one go with a checkpoint every k steps, resumes from checkpoint-k with
// a set built again by newSet (finetune.Resume with WithAdapters), continues to cfg.Steps, and checks that the
// losses of steps k+1.. and the final trainable tensors are bit-identical to the uninterrupted run's. It also
// checks that resuming without WithAdapters is refused with an error naming it.
func CheckResume(t testing.TB, model finetune.Model, cfg finetune.Config, newSet func() *adapter.Set, data finetune.Examples, k int) {
	t.Helper()
	out := t.TempDir()
	cfg.CheckpointEvery = k
	whole, trWhole := Fit(t, model, cfg, newSet(), data, out)
	ckpt := filepath.Join(out, fmt.Sprintf("checkpoint-%d", k))
	if _, err := finetune.Resume(ckpt, model, gtest.Backend(t), nil); err == nil || !strings.Contains(err.Error(), "WithAdapters") {
		t.Errorf("resume of a custom run without its adapters: error %v, want one naming WithAdapters", err)
	}
	loader, err := finetune.NewLoader(data, 6, cfg.Seed, true)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := finetune.Resume(ckpt, model, gtest.Backend(t), loader, finetune.WithAdapters(newSet()))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Step != k {
		t.Fatalf("resumed at step %d, want %d", tr.Step, k)
	}
	var losses []float64
	if err := tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{OnStep: func(s finetune.StepStats) { losses = append(losses, s.Loss) }}); err != nil {
		t.Fatal(err)
	}
	if len(losses) != len(whole)-k {
		t.Fatalf("resumed run did %d steps, want %d", len(losses), len(whole)-k)
	}
	for i, l := range losses {
		if l != whole[k+i] {
			t.Errorf("step %d: resumed loss %v, uninterrupted %v", k+i+1, l, whole[k+i])
		}
	}
	if len(tr.Train) != len(trWhole.Train) {
		t.Errorf("%d trainable tensors after resume, %d uninterrupted", len(tr.Train), len(trWhole.Train))
	}
	for n, p := range trWhole.Train {
		q, ok := tr.Train[n]
		if !ok {
			t.Errorf("%s missing after resume", n)
			continue
		}
		if d := gtest.MaxAbsDiff(gtest.Float32s(p), gtest.Float32s(q)); d != 0 {
			t.Errorf("%s differs by %g after resume", n, d)
		}
	}
}
