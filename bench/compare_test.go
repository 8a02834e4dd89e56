package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
)

// TestStepAndCompare runs `bench step`'s code on a tiny ViT preset in two variants, writes the results as
// compare.sh does beside two PyTorch-side files, and checks the pairing, the ratios and the goal lines.
func TestStepAndCompare(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	dir := t.TempDir()
	ckpt, err := PresetCheckpoint("vit:tiny", 3, dir)
	if err != nil {
		t.Fatal(err)
	}
	st1, _ := os.Stat(filepath.Join(ckpt, "model.safetensors"))
	if again, err := PresetCheckpoint("vit:tiny", 3, dir); err != nil || again != ckpt {
		t.Errorf("second call: %s, %v", again, err)
	} else if st2, _ := os.Stat(filepath.Join(ckpt, "model.safetensors")); st1 == nil || !st2.ModTime().Equal(st1.ModTime()) {
		t.Error("the checkpoint was written again instead of reused")
	}
	if _, err := PresetCheckpoint("nonsense", 3, dir); err == nil {
		t.Error("an unknown model was accepted")
	}
	method, err := GridMethodByName("lora-all")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	os.MkdirAll(out, 0o755)
	put := func(name string, v any) {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	peaks := map[string]int64{}
	for _, vn := range []string{"plain", "approx-act+ms-norm"} {
		v, _ := finetune.VariantByName(vn)
		r, err := RunStep(backend, ckpt, finetune.Shape{Batch: 4}, finetune.Defaults(), method, v, 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.PeakBytes <= 0 || r.StepSeconds <= 0 || r.Batch != 4 || r.DevicePeakBytes != 0 {
			t.Errorf("%s: figures %+v", vn, r)
		}
		r.Model = "vit:tiny"
		peaks[vn] = r.PeakBytes
		put("memfit-"+vn+".json", r)
	}
	put("pytorch-plain.json", map[string]any{"model": "vit:tiny", "method": "lora-all", "variant": "plain",
		"peak_bytes": 1000, "peak_method": "torch.cuda.max_memory_allocated", "per_second": 10.0, "unit": "images/s"})
	put("pytorch-approx.json", map[string]any{"model": "vit:tiny", "method": "lora-all", "variant": "approx-act+ms-norm",
		"peak_bytes": 800, "peak_method": "torch.cuda.max_memory_allocated", "per_second": 8.0, "unit": "images/s"})
	rows, err := ReadComparison(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Variant != "plain" || rows[1].Memfit == nil || rows[1].PyTorch == nil {
		t.Fatalf("rows %+v", rows)
	}
	a := rows[1]
	if want := float64(peaks["approx-act+ms-norm"]) / float64(peaks["plain"]); math.Abs(a.MemfitPeakRatio-want) > 1e-12 {
		t.Errorf("memfit ratio %g, want %g", a.MemfitPeakRatio, want)
	}
	if a.PyTorchPeakRatio != 0.8 || math.Abs(a.PeakVsPyTorch-float64(peaks["approx-act+ms-norm"])/800) > 1e-12 {
		t.Errorf("PyTorch ratios %+v", a)
	}
	var buf bytes.Buffer
	if err := WriteComparison(&buf, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"memfit/PyTorch", "goal <= 0.72", "torch.cuda.max_memory_allocated", "liveness simulation"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
	if _, err := ReadComparison(t.TempDir()); err == nil {
		t.Error("an empty folder compared")
	}
}
