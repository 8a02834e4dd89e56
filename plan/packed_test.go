package plan

import (
	"testing"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
)

// TestPlanPackedStep: the planner plans a packed LLaMA step (--packing: position_ids among the inputs, a per-row
// block-diagonal mask) as the trainer runs it: the saved activations it plans at Shape.Packed are exactly those
// the trainer's step has on a packed batch of that shape, and its step peak is off the trainer's by the same
// bytes as for the unpacked step (the trainer's device step holds a little more than the gradient step the
// planner builds, packed or not); both differ from the unpacked step's, which would not account for packing.
func TestPlanPackedStep(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	cfg := finetune.Defaults()
	cfg.Steps = 1
	model, shp, err := ShapeModel("llama:tiny", cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if model, err = finetune.WithRandomWeights(model, cfg, 1); err != nil {
		t.Fatal(err)
	}
	plans := map[bool]StepMemory{}
	offset := map[bool]int64{}
	for _, packed := range []bool{false, true} {
		in := finetune.Shape{Batch: 2, Seq: 64, Packed: packed}
		p, err := Step(backend, model, shp, cfg, in)
		if err != nil {
			t.Fatal(err)
		}
		plans[packed] = p
		b := finetune.RandomBatch(model, in, 3)
		if _, ok := b["position_ids"]; ok != packed {
			t.Fatalf("packed %v: random batch has position_ids: %v", packed, ok)
		}
		tr, err := finetune.New(model, cfg, backend)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tr.TrainStep([]finetune.Batch{b})
		tr.Release()
		if err != nil {
			t.Fatal(err)
		}
		if s.SavedActivationBytes != p.SavedActivationBytes {
			t.Errorf("packed %v: planned saved %d, the trainer's step %d", packed, p.SavedActivationBytes, s.SavedActivationBytes)
		}
		offset[packed] = s.PeakBytes - p.PeakBytes
	}
	if offset[true] != offset[false] {
		t.Errorf("the trainer's peak is %d bytes above the plan packed, %d unpacked", offset[true], offset[false])
	}
	if plans[true].PeakBytes <= plans[false].PeakBytes || plans[true].SavedActivationBytes <= plans[false].SavedActivationBytes {
		t.Errorf("packed peak %d, unpacked %d: the packed step holds position_ids and a per-row mask", plans[true].PeakBytes, plans[false].PeakBytes)
	}
	t.Logf("saved %d / %d, peak %d / %d (unpacked / packed)", plans[false].SavedActivationBytes, plans[true].SavedActivationBytes, plans[false].PeakBytes, plans[true].PeakBytes)
}
