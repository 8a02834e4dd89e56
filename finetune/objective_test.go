package finetune_test

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/plan"
	"github.com/memfit/memfit/preference"
)

var tinyDir = filepath.Join("..", "pretrained", "llama-tiny")

// pairFile writes n preference pairs built from alpaca-libre (preference.FromInstructions) as JSONL and returns
// its path.
func pairFile(t *testing.T, n int) string {
	t.Helper()
	rows, err := data.ReadInstructions(pairSource(t))
	if err != nil {
		t.Fatal(err)
	}
	pairs, err := preference.FromInstructions(rows, n, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pairs.jsonl")
	writeJSONLPairs(t, path, pairs)
	return path
}

// pairSource is alpaca-libre v1 in the shared data (the test skips without it).
func pairSource(t *testing.T) string {
	return filepath.Join(golden.SharedDir(t), "alpaca-libre", "alpaca_libre_tasks_v1.jsonl")
}

// int32s returns an integer tensor's values.
func int32s(t *testing.T, x *tensors.Tensor) []int32 {
	t.Helper()
	var out []int32
	for _, v := range gtest.Float32s(x) {
		out = append(out, int32(v))
	}
	return out
}

// firstRows returns the first n examples of ex as a batch.
func firstRows(t *testing.T, ex finetune.Examples, n int) finetune.Batch {
	t.Helper()
	l, err := finetune.NewLoader(ex, n, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Next()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDPOStartsAtTheReference: the reference is the policy as it starts, so DPO's first step (before any update)
// has loss ln 2 and zero rewards, whatever the policy's start is: fresh LoRA adapters (the reference runs the base
// with them off and keeps no copy), an init adapter (a frozen copy of its trained tensors, applied) and full
// fine-tuning (a frozen copy of every weight). The second step's rewards are not zero: the reference stayed where
// the policy started.
func TestDPOStartsAtTheReference(t *testing.T) {
	path := pairFile(t, 8)
	for _, tc := range []struct {
		name, method, init string
		copies             func(trainable int) int
	}{
		{"lora", finetune.MethodLoRA, "", func(int) int { return 0 }},
		{"init adapter", finetune.MethodLoRA, filepath.Join("..", "pretrained", "llama-tiny-alpaca"), func(n int) int { return n }},
		{"full", finetune.MethodFull, "", func(n int) int { return n }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := finetune.PreferenceDefaults(config(tc.method, 2), preference.DPO)
			cfg.BatchSize, cfg.LR = 4, 1e-2
			if tc.init != "" {
				cfg.InitAdapter, cfg.LoRARank, cfg.LoRAAlpha, cfg.LoRATarget = tc.init, 16, 32, nil
			}
			model, err := finetune.LoadModel(tinyDir, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ex, err := finetune.PairExamples(path, finetune.DataOptions{SeqLen: 96}, model, tinyDir, nil)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := finetune.New(model, cfg, gtest.Backend(t))
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Release()
			copies := 0
			for n := range tr.Frozen {
				if strings.HasPrefix(n, "ref.") {
					copies++
				}
			}
			if want := tc.copies(len(tr.Train)); copies != want {
				t.Errorf("%d frozen copies for the reference, want %d", copies, want)
			}
			b := firstRows(t, ex, 4)
			s1, err := tr.TrainStep([]finetune.Batch{b})
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(s1.Loss-math.Ln2) > 1e-6 || math.Abs(s1.Metrics["rewards/chosen"]) > 1e-6 || math.Abs(s1.Metrics["rewards/rejected"]) > 1e-6 {
				t.Errorf("first step: loss %.7f (want ln 2 = %.7f), rewards %v", s1.Loss, math.Ln2, s1.Metrics)
			}
			if s1.Metrics["logps/chosen"] >= 0 || len(s1.Metrics) != len(preference.Metrics(preference.DPO)) {
				t.Errorf("first step's metrics %v", s1.Metrics)
			}
			s2, err := tr.TrainStep([]finetune.Batch{b})
			if err != nil {
				t.Fatal(err)
			}
			if s2.Metrics["rewards/margins"] <= 0 || s2.Loss >= math.Ln2 {
				t.Errorf("second step on the same pairs: loss %.5f, margin %.5f: the update did not favour the chosen completions over the reference",
					s2.Loss, s2.Metrics["rewards/margins"])
			}
		})
	}
}

// TestDPOReferenceKeepsNothing: a DPO step's reference pass keeps no activation for the backward pass (the saved
// activations, read off the training graph by memory.Saved, are those of the same step with precomputed
// reference log-likelihoods), and the step keeps what an SFT step on twice the batch keeps (chosen and rejected
// run as one batch), in every memory mode; full fine-tuning's frozen copy of the weights is counted.
func TestDPOReferenceKeepsNothing(t *testing.T) {
	backend := gtest.Backend(t)
	in := finetune.Shape{Batch: 2, Seq: 32}
	step := func(cfg finetune.Config, in finetune.Shape) plan.StepMemory {
		t.Helper()
		m, shp, err := plan.ShapeModel("llama:tiny", cfg, 0)
		if err != nil {
			t.Fatal(err)
		}
		s, err := plan.Step(backend, m, shp, cfg, in)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, v := range []string{"plain", "approx-act+ms-norm", "mesa"} {
		variant, err := finetune.VariantByName(v)
		if err != nil {
			t.Fatal(err)
		}
		base := variant.Apply(config(finetune.MethodLoRA, 1))
		dpo := finetune.PreferenceDefaults(base, preference.DPO)
		pre := dpo
		pre.PrecomputeRef = true
		sft := step(base, finetune.Shape{Batch: 2 * in.Batch, Seq: in.Seq})
		withRef, precomputed := step(dpo, in), step(pre, in)
		if withRef.SavedActivationBytes != precomputed.SavedActivationBytes {
			t.Errorf("%s: the reference pass keeps %d bytes for the backward pass (saved %d with it, %d precomputed)", v,
				withRef.SavedActivationBytes-precomputed.SavedActivationBytes, withRef.SavedActivationBytes, precomputed.SavedActivationBytes)
		}
		// The pair step keeps the [2B] log-likelihoods and masks besides what the SFT step on 2B sequences keeps.
		if d := withRef.SavedActivationBytes - sft.SavedActivationBytes; d < 0 || d > 16<<10 {
			t.Errorf("%s: DPO on %d pairs keeps %d bytes, SFT on %d sequences %d", v, in.Batch, withRef.SavedActivationBytes, 2*in.Batch, sft.SavedActivationBytes)
		}
		if withRef.WeightsBytes != sft.WeightsBytes {
			t.Errorf("%s: LoRA's reference holds %d weight bytes more than SFT: it should run the same base with the adapters off", v, withRef.WeightsBytes-sft.WeightsBytes)
		}
	}
	full := config(finetune.MethodFull, 1)
	sft, dpo := step(full, in), step(finetune.PreferenceDefaults(full, preference.DPO), in)
	trained := sft.GradientBytes // float32 gradients, one per trained weight; the copy is float32 too
	if dpo.WeightsBytes != sft.WeightsBytes+trained {
		t.Errorf("full fine-tuning: DPO holds %d weight bytes, SFT %d: the reference's frozen copy (%d bytes) is not counted", dpo.WeightsBytes, sft.WeightsBytes, trained)
	}
}
