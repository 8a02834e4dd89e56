package finetune_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/quant"
)

func maxRelDiff(t *testing.T, a, b *tensors.Tensor) float64 {
	t.Helper()
	var x, y []float32
	tensors.MustConstFlatData[float32](a, func(f []float32) { x = append([]float32(nil), f...) })
	tensors.MustConstFlatData[float32](b, func(f []float32) { y = append([]float32(nil), f...) })
	var diff, scale float64
	for i := range x {
		diff = math.Max(diff, math.Abs(float64(x[i]-y[i])))
		scale = math.Max(scale, math.Abs(float64(y[i])))
	}
	return diff / scale
}

// qloraModels writes tiny ViT and LLaMA checkpoints with non-trivial norms.
func qloraModels(t *testing.T) map[string]string {
	dirs := map[string]string{}
	vcfg, _ := vit.Preset("tiny", 3)
	vp := vit.RandomParams(vcfg, 21)
	randomNorms(vp)
	vj, _ := vcfg.JSON()
	dirs["vit"] = filepath.Join(t.TempDir(), "vit")
	if err := models.SaveCheckpoint(dirs["vit"], vj, vp, 0); err != nil {
		t.Fatal(err)
	}
	lcfg, _ := llama.Preset("tiny", 0)
	lp := decoder.RandomParams(lcfg, 22)
	randomNorms(lp)
	lj, _ := llama.JSON(lcfg)
	dirs["llama"] = filepath.Join(t.TempDir(), "llama")
	if err := models.SaveCheckpoint(dirs["llama"], lj, lp, 0); err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestQLoRAFoldingIsExact: a QLoRA model with MS-norm (norms folded into the NF4 weights) gives the logits of
// the plain model whose linear weights are the dequantised NF4 ones (folding after dequantisation), up to
// float32 rounding.
func TestQLoRAFoldingIsExact(t *testing.T) {
	backend, _ := engine.NewBackend(engine.ChooseSpec("go"))
	defer backend.Finalize()
	dirs := qloraModels(t)
	_, images := imageTask(t, vit.Options{})
	_, text := textTask(t, decoder.Options{})
	batches := map[string]finetune.Batch{"vit": finetune.Batch{"pixel_values": images["pixel_values"]},
		"llama": finetune.Batch{"input_ids": text["input_ids"], "attention_mask": text["attention_mask"]}}
	for name, dir := range dirs {
		cfg := finetune.Defaults()
		cfg.Method, cfg.MSNorm = finetune.MethodQLoRA, true
		q, err := finetune.LoadModel(dir, cfg)
		if err != nil {
			t.Fatal(err)
		}
		nf4 := 0
		for n := range q.Params() {
			if filepath.Ext(n) == quant.SuffixCodes {
				nf4++
			}
		}
		if nf4 == 0 || len(q.Folded()) == 0 {
			t.Fatalf("%s: %d NF4 weights, %d folded norm tensors", name, nf4, len(q.Folded()))
		}
		plainCfg := finetune.Defaults()
		plain, err := finetune.LoadModel(dir, plainCfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range plain.LinearLayers() {
			if l.Head {
				continue
			}
			w, _ := plain.Params().Float32s(l.Path + ".weight")
			nq, _ := quant.QuantizeNF4(w, l.Out, l.In, true)
			plain.Params()[l.Path+".weight"] = tensors.FromFlatDataAndDimensions(nq.Dequantize(), l.Out, l.In)
		}
		got, err := finetune.Logits(backend, q, nil, nil, batches[name])
		if err != nil {
			t.Fatal(err)
		}
		want, err := finetune.Logits(backend, plain, nil, nil, batches[name])
		if err != nil {
			t.Fatal(err)
		}
		d := maxRelDiff(t, got, want)
		t.Logf("%s: QLoRA+MS-norm vs fold-after-dequant logits: max difference %.2g of the largest logit", name, d)
		if d > 2e-5 {
			t.Errorf("%s: logits differ by %g (relative)", name, d)
		}
	}
}

// TestQLoRATraining: a QLoRA step keeps no float weight-shaped tensor for backward, training lowers the loss,
// and the merged export (into the dequantised base) reproduces the trained logits.
func TestQLoRATraining(t *testing.T) {
	backend, _ := engine.NewBackend(engine.ChooseSpec("go"))
	defer backend.Finalize()
	dirs := qloraModels(t)
	cfg := config(finetune.MethodQLoRA, 12)
	cfg.LoRATarget, cfg.MSNorm, cfg.ApproxAct, cfg.LR = []string{"all-linear"}, true, true, 5e-3
	model, err := finetune.LoadModel(dirs["llama"], cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, text := textTask(t, decoder.Options{})
	tr, err := finetune.New(model, cfg, backend)
	if err != nil {
		t.Fatal(err)
	}
	loader, _ := finetune.NewLoader(text, cfg.BatchSize, 1, true)
	var first, last float64
	weightShapes := map[[2]int]bool{}
	for _, l := range model.LinearLayers() {
		weightShapes[[2]int{l.Out, l.In}] = true
	}
	for i := 0; i < cfg.Steps; i++ {
		b, _ := loader.Next()
		st, err := tr.TrainStep([]finetune.Batch{b})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = st.Loss
			rep := tr.SavedReport(b)
			for _, s := range rep.Tensors {
				if d := s.Shape.Dimensions; s.Shape.DType.IsFloat() && len(d) == 2 && weightShapes[[2]int{d[0], d[1]}] {
					t.Errorf("saved for backward: a weight-shaped float tensor %s from %s", s.Shape, s.Op)
				}
				if s.Shape.DType == dtypes.Uint8 && s.Kind.String() == "linear" {
					t.Errorf("NF4 codes counted as saved activations: %s", s.Shape)
				}
			}
		}
		last = st.Loss
	}
	if !(last < first) {
		t.Errorf("QLoRA loss %g -> %g", first, last)
	}
	b, _ := loader.Next()
	trained, err := tr.Logits(b)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "merged")
	if err := tr.ExportMerged(dir); err != nil {
		t.Fatal(err)
	}
	merged, err := llama.Load(dir, decoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := finetune.Logits(backend, lm.Model{Model: merged, Spec: llama.Spec}, nil, nil, b)
	if err != nil {
		t.Fatal(err)
	}
	if d := maxRelDiff(t, got, trained); d > 5e-5 {
		t.Errorf("merged export logits differ from the trained QLoRA model's by %g", d)
	}
}
