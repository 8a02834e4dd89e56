// Package adaptertest holds what tests of adapters over any model family share: a PEFT adapter folder read into a
// model and run.
package adaptertest

import (
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
)

// Logits reads the PEFT adapter in dir into model (finetune.ReadAdapter: its adapters, and modules_to_save in
// place of the model's tensors) and returns the logits of batch.
func Logits(t testing.TB, model finetune.Model, dir string, batch finetune.Batch) []float32 {
	t.Helper()
	imported, err := finetune.ReadAdapter(dir, model)
	if err != nil {
		t.Fatal(err)
	}
	params := models.Params{}
	for n, v := range model.Params() {
		params[n] = v
	}
	for n, v := range imported.Modules {
		params[n] = v
	}
	got, err := finetune.Logits(gtest.Backend(t), model, params, imported.Set, batch)
	if err != nil {
		t.Fatal(err)
	}
	return gtest.Float32s(got)
}
