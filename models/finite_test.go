package models_test

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/compute/dtypes/bfloat16"
	"github.com/gomlx/compute/dtypes/float16"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/safetensors"
)

// TestCheckFinite: the first NaN or infinity of a float32, float64, float16 or bfloat16 tensor is named with its
// position and value; finite tensors and integer ones pass.
func TestCheckFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	for _, tc := range []struct {
		t    *tensors.Tensor
		want string
	}{
		{tensors.FromFlatDataAndDimensions([]float32{1, 2, 3, nan, inf, 6}, 2, 3), `tensor "w" holds NaN at [1 0]`},
		{tensors.FromFlatDataAndDimensions([]float64{1, math.Inf(1)}, 2), `tensor "w" holds +Inf at [1]`},
		{tensors.FromFlatDataAndDimensions([]float16.Float16{float16.FromFloat32(1), float16.FromFloat32(inf)}, 1, 2), `tensor "w" holds -Inf at [0 1]`},
		{tensors.FromFlatDataAndDimensions([]bfloat16.BFloat16{bfloat16.FromFloat32(nan), bfloat16.FromFloat32(2)}, 2), `tensor "w" holds NaN at [0]`},
		{tensors.FromFlatDataAndDimensions([]float32{1, 2, 3e38, -3e38}, 4), ""},
		{tensors.FromFlatDataAndDimensions([]bfloat16.BFloat16{bfloat16.FromFloat32(3e38)}, 1), ""},
		{tensors.FromFlatDataAndDimensions([]int32{-1, 1 << 30}, 2), ""},
	} {
		err := models.CheckFinite(tc.t, "w")
		var nf *models.NonFiniteError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.t, err)
		case tc.want != "" && (err == nil || !errors.As(err, &nf) || !strings.HasPrefix(err.Error(), tc.want)):
			t.Errorf("%v: error %v, want %q", tc.t, err, tc.want)
		}
	}
}

// TestNonFiniteWeightsRefusedAtLoad: a model checkpoint with a NaN in one float16 weight is refused when loaded,
// naming the tensor, the position and the value.
func TestNonFiniteWeightsRefusedAtLoad(t *testing.T) {
	src := filepath.Join("..", "pretrained", "llama-tiny")
	dir := t.TempDir()
	cfg, _ := os.ReadFile(filepath.Join(src, "config.json"))
	os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
	f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]safetensors.Entry{}
	for _, n := range f.Names() {
		v, err := f.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		if n == "model.layers.2.mlp.up_proj.weight" {
			vals := tensors.MustCopyFlatData[float32](v)
			vals[3*128+7] = float32(math.NaN())
			v = tensors.FromFlatDataAndDimensions(vals, v.Shape().Dimensions...)
		}
		if entries[n], err = safetensors.FromTensor(v, safetensors.F16); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), entries, nil); err != nil {
		t.Fatal(err)
	}
	_, err = llama.Load(dir, decoder.Options{})
	want := `tensor "model.layers.2.mlp.up_proj.weight" holds NaN at [3 7], its first non-finite value`
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
		t.Errorf("error %v, want one line with %q", err, want)
	}
}
