package models_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/safetensors"
)

func tensorBytes(t *testing.T, p models.Params, name string) []byte {
	var b []byte
	if err := p[name].ConstBytes(func(x []byte) { b = append([]byte(nil), x...) }); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCheckpointRoundTrip: load -> save -> load gives identical bytes per tensor, for one file and for shards;
// the saved single file equals the golden file byte for byte.
func TestCheckpointRoundTrip(t *testing.T) {
	dir := filepath.Join(golden.SharedDir(t), "golden")
	for _, name := range []string{"llama_a", "llama_c", "vit_a"} {
		src := filepath.Join(dir, name)
		var shapes map[string][]int
		var config []byte
		if name == "vit_a" {
			cfg, err := vit.LoadConfig(src)
			if err != nil {
				t.Fatal(err)
			}
			shapes = vit.Shapes(cfg)
		} else {
			cfg, err := llama.LoadConfig(src)
			if err != nil {
				t.Fatal(err)
			}
			shapes = decoder.Shapes(cfg)
		}
		config, _ = os.ReadFile(filepath.Join(src, "config.json"))
		p, err := models.LoadParams(src, shapes, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, shard := range []int64{0, 20000} {
			out := t.TempDir()
			if err := models.SaveCheckpoint(out, config, p, shard); err != nil {
				t.Fatal(err)
			}
			back, err := models.LoadParams(out, shapes, models.LoadOptions{})
			if err != nil {
				t.Fatalf("%s (shard %d): %v", name, shard, err)
			}
			for _, n := range p.Names() {
				if !bytes.Equal(tensorBytes(t, back, n), tensorBytes(t, p, n)) {
					t.Errorf("%s (shard %d): tensor %s changed", name, shard, n)
				}
			}
			files, _ := os.ReadDir(out)
			if shard == 0 {
				want, _ := os.ReadFile(filepath.Join(src, "model.safetensors"))
				got, _ := os.ReadFile(filepath.Join(out, "model.safetensors"))
				if !bytes.Equal(got, want) {
					t.Errorf("%s: saved model.safetensors differs from transformers' file", name)
				}
			} else if len(files) < 4 {
				t.Errorf("%s: sharded save wrote only %d files", name, len(files))
			}
		}
	}
}

// TestToBFloat16RoundTrip: float32 tensors become bfloat16 (rounded to nearest, ties to even), an int tensor is
// kept, and a checkpoint saved from them stores BF16 that reads back to the rounded values.
func TestToBFloat16RoundTrip(t *testing.T) {
	vals := []float32{1, 1 + 1.0/256, 1 + 3.0/256, -3.14159, 0, 65504}
	p := models.Params{
		"w":   tensors.FromFlatDataAndDimensions(append([]float32(nil), vals...), 2, 3),
		"ids": tensors.FromFlatDataAndDimensions([]int32{1, 2}, 2),
	}
	if _, err := p.ToBFloat16(); err != nil {
		t.Fatal(err)
	}
	if p["w"].DType() != dtypes.BFloat16 || p["ids"].DType() != dtypes.Int32 {
		t.Fatalf("dtypes %s %s", p["w"].DType(), p["ids"].DType())
	}
	dir := t.TempDir()
	if err := models.SaveCheckpoint(dir, []byte(`{}`), p, 0); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := ck.Info("w"); info.DType != safetensors.BF16 {
		t.Errorf("stored as %s", info.DType)
	}
	back, err := ck.TensorAs("w", dtypes.Float32)
	if err != nil {
		t.Fatal(err)
	}
	got := back.Value().([][]float32)
	for i, v := range vals {
		if want := safetensors.BF16ToF32(safetensors.F32ToBF16(v)); got[i/3][i%3] != want {
			t.Errorf("element %d: %g, want %g", i, got[i/3][i%3], want)
		}
	}
	if got[0][1] != 1 || got[0][2] != 1+4.0/256 { // ties to even: 1+1/256 -> 1, 1+3/256 -> 1+4/256
		t.Errorf("rounding: %v", got[0])
	}
}
