package finetune_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	vitfam "github.com/memfit/memfit/family/vit"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/vit"
)

// TestNonFiniteAtFirstStepNotBlamedOnLR: a loss that is not finite at step 1 comes before any update, so the
// error does not tell the user to lower the learning rate: it names the weight that is not finite (a model built
// in Go; loading refuses such checkpoints) or points at the data (a NaN pixel), on the device-resident step and
// the host-side one (hoststep_test.go).
func TestNonFiniteAtFirstStepNotBlamedOnLR(t *testing.T) {
	for _, host := range []bool{false, true} {
		step := func(tr *finetune.Trainer, b finetune.Batch) error {
			if host {
				hs := finetune.NewHostStep(tr)
				defer hs.Release()
				_, err := hs.TrainStep([]finetune.Batch{b})
				return err
			}
			_, err := tr.TrainStep([]finetune.Batch{b})
			return err
		}
		model, data := imageTask(t, vit.Options{})
		v := model.(vitfam.Model)
		const name = "vit.encoder.layer.0.intermediate.dense.weight"
		vals := tensors.MustCopyFlatData[float32](v.Model.Params[name])
		vals[5] = float32(math.Inf(1))
		v.Model.Params[name] = tensors.FromFlatDataAndDimensions(vals, v.Model.Params[name].Shape().Dimensions...)
		tr, err := finetune.New(model, config(finetune.MethodLoRA, 2), gtest.Backend(t))
		if err != nil {
			t.Fatal(err)
		}
		loader, _ := finetune.NewLoader(data, 4, 1, false)
		b, _ := loader.Next()
		err = step(tr, b)
		if !errors.Is(err, finetune.ErrNonFinite) || strings.Contains(err.Error(), "learning rate") && !strings.Contains(err.Error(), "not the learning rate") ||
			!strings.Contains(err.Error(), `tensor "`+name+`" holds +Inf at [0 5]`) || !strings.Contains(err.Error(), "before any update") {
			t.Errorf("host %v, an infinite weight: error %v", host, err)
		}
		t.Logf("host %v: %v", host, err)

		model, data = imageTask(t, vit.Options{})
		px := tensors.MustCopyFlatData[float32](data["pixel_values"])
		px[17] = float32(math.NaN())
		data["pixel_values"] = tensors.FromFlatDataAndDimensions(px, data["pixel_values"].Shape().Dimensions...)
		tr, err = finetune.New(model, config(finetune.MethodLoRA, 2), gtest.Backend(t))
		if err != nil {
			t.Fatal(err)
		}
		loader, _ = finetune.NewLoader(data, 4, 1, false)
		b, _ = loader.Next()
		err = step(tr, b)
		if !errors.Is(err, finetune.ErrNonFinite) || strings.Contains(err.Error(), "lower the learning rate") || !strings.Contains(err.Error(), "the data") {
			t.Errorf("host %v, a NaN pixel: error %v", host, err)
		}
		t.Logf("host %v: %v", host, err)
	}
}
