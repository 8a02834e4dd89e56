package plan

import (
	"strings"
	"testing"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models/vit"
)

// analyticViTLoRA counts, from the shapes alone, the bytes a ViT classifier's training step keeps with LoRA
// (rank r) on every linear layer of the encoder and a frozen classifier, float32, standard attention
// (T = batch x tokens rows, D hidden, M MLP, per layer):
//
//   - each LayerNorm: z [T, D] and rstd [T]; plain LN also its affine output [T, D], the next linear layers'
//     input (MS-LN: z is that input). The first layer's first norm has no gradient to pass on (the embeddings
//     are frozen), so it keeps only what its linear layers read: the affine output (plain) or z (MS-LN).
//   - attention: the scaled q, k and v [T, D] each and the probabilities [B, H, N, N]; the output projection's
//     input [T, D].
//   - every LoRA layer (q, k, v, o, fc1, fc2): A x [T, r] for B's gradient (x itself is counted above).
//   - GELU: its input [T, M] (ReGELU2: 2-bit codes, T*M/4 bytes); the down projection's input [T, M].
//   - the final LayerNorm, applied to the CLS rows only: z [B, D] and rstd [B] (the frozen classifier keeps
//     nothing); the loss (with the pure-Go backend's fused softmax): the probabilities [B, labels], two [B] row
//     values (the largest probability, the label mask), the [B, 2] gather indices, one scalar.
func analyticViTLoRA(c vit.Config, batch, r, labels int, approx, ms bool) int64 {
	const f = 4
	n := int64(c.NumPatches() + 1)
	B, T, D, M, H, R := int64(batch), int64(batch)*n, int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.NumAttentionHeads), int64(r)
	norm := T*D*f + T*f
	first := T * D * f
	if !ms {
		norm += T * D * f
	}
	act := T * M * f
	if approx {
		act = (T*M + 3) / 4
	}
	layer := 2*norm + 3*T*D*f + B*H*n*n*f + T*D*f + 6*T*R*f + act + T*M*f
	total := int64(c.NumHiddenLayers)*layer - norm + first
	total += B*D*f + B*f
	total += B*int64(labels)*f + 2*B*f + 2*B*4 + 4
	return total
}

func TestPlanMemoryMatchesAnalyticCount(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	for _, preset := range []struct {
		name  string
		batch int
	}{{"vit:tiny", 2}, {"vit-b16", 8}} {
		cfg := finetune.Defaults()
		cfg.LoRATarget = []string{"all-linear"}
		rep, err := Memory(backend, MemoryRequest{Model: preset.name, Config: cfg, Labels: 10, Shape: finetune.Shape{Batch: preset.batch}})
		if err != nil {
			t.Fatal(err)
		}
		c, _ := vit.Preset(strings.TrimPrefix(preset.name, "vit:"), 10)
		var plain, best int64
		for _, v := range rep.Variants {
			if v.Name == "grad-ckpt" || strings.Contains(v.Name, "mesa") {
				continue
			}
			want := analyticViTLoRA(c, preset.batch, cfg.LoRARank, 10, v.Name == "approx-act" || v.Name == "approx-act+ms-norm",
				v.Name == "ms-norm" || v.Name == "approx-act+ms-norm")
			if v.SavedActivationBytes != want {
				t.Errorf("%s %s: saved %d bytes, analytic count %d", preset.name, v.Name, v.SavedActivationBytes, want)
			}
			var sum int64
			for _, b := range v.SavedByKind {
				sum += b
			}
			if sum != v.SavedActivationBytes {
				t.Errorf("%s %s: saved_by_kind sums to %d, total %d", preset.name, v.Name, sum, v.SavedActivationBytes)
			}
			switch v.Name {
			case "plain":
				plain = v.SavedActivationBytes
			case "approx-act+ms-norm":
				best = v.SavedActivationBytes
			}
		}
		t.Logf("%s batch %d: approx-act+ms-norm keeps %.3fx plain's activations", preset.name, preset.batch, float64(best)/float64(plain))
		if preset.name == "vit-b16" && float64(best) > 0.72*float64(plain) {
			t.Errorf("vit-b16: approx-act+ms-norm saved %d > 0.72 x plain %d", best, plain)
		}
		for _, ck := range rep.Variants {
			if ck.Name == "grad-ckpt" && ck.SavedActivationBytes >= best {
				t.Errorf("grad-ckpt should keep the least: %+v", ck)
			}
		}
		// LoRA r on q, k, v, o, fc1, fc2 of every layer: r*(in+out) each.
		d, m := c.HiddenSize, c.IntermediateSize
		if want := int64(c.NumHiddenLayers * cfg.LoRARank * (4*2*d + 2*(d+m))); rep.Variants[0].TrainableParams != want {
			t.Errorf("%s: %d trainable params, want %d", preset.name, rep.Variants[0].TrainableParams, want)
		}
	}
}

func TestPlanMemoryLlama(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	cfg := finetune.Defaults()
	cfg.LoRATarget = []string{"all-linear"}
	rep, err := Memory(backend, MemoryRequest{Model: "llama-1b", Config: cfg, Shape: finetune.Shape{Batch: 1, Seq: 256}, Variants: []finetune.Variant{finetune.Variants[0], finetune.Variants[3]}})
	if err != nil {
		t.Fatal(err)
	}
	plain, best := rep.Variants[0], rep.Variants[1]
	t.Logf("llama-1b: saved %.3fx, step peak %.3fx", best.SavedRatio, best.PeakRatio)
	// 0.669x: ReSiLU2's codes, MS-RMSNorm's shared outputs and the gated product rebuilt from its saved factors.
	if best.SavedRatio > 0.70 {
		t.Errorf("approx-act+ms-norm keeps %.3fx plain's activations, want <= 0.70", best.SavedRatio)
	}
	// LoRA r=8 on q,k,v,o,gate,up,down of 22 layers (TinyLlama-1.1B shapes): r*(in+out) each.
	d, kv, m := 2048, 4*64, 5632
	perLayer := 8 * ((d + d) + (d + kv) + (d + kv) + (d + d) + (d + m) + (d + m) + (m + d))
	if want := int64(22 * perLayer); plain.TrainableParams != want {
		t.Errorf("trainable params %d, want %d", plain.TrainableParams, want)
	}
	if plain.OptimizerBytes != 2*4*plain.TrainableParams || plain.GradientBytes != 4*plain.TrainableParams {
		t.Errorf("optimizer %d / gradient %d bytes for %d trainable float32 params", plain.OptimizerBytes, plain.GradientBytes, plain.TrainableParams)
	}
	if plain.PeakBytes < plain.WeightsBytes+plain.SavedActivationBytes {
		t.Errorf("peak %d below weights %d + saved activations %d", plain.PeakBytes, plain.WeightsBytes, plain.SavedActivationBytes)
	}
}

func TestCapacities(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	cfg := finetune.Defaults()
	vs := []finetune.Variant{finetune.Variants[0], finetune.Variants[3]}
	fits, err := Capacities(backend, CapacityRequest{Model: "llama:tiny", Config: cfg, Shape: finetune.Shape{Batch: 2, Seq: 8}, Axis: "seq", Budget: 2 << 20, Limit: 4096, Variants: vs})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fits {
		// The answer is the boundary: Max fits, Max+1 does not.
		model, shp, _ := ShapeModel("llama:tiny", finetune.Variants[0].Apply(cfg), 0)
		if f.Variant == vs[1].Name {
			model, shp, _ = ShapeModel("llama:tiny", vs[1].Apply(cfg), 0)
		}
		vc := cfg
		if f.Variant == vs[1].Name {
			vc = vs[1].Apply(cfg)
		}
		at, err := Step(backend, model, shp, vc, finetune.Shape{Batch: 2, Seq: f.Max})
		if err != nil {
			t.Fatal(err)
		}
		above, err := Step(backend, model, shp, vc, finetune.Shape{Batch: 2, Seq: f.Max + 1})
		if err != nil {
			t.Fatal(err)
		}
		if f.Max < 2 || at.TotalBytes > 2<<20 || above.TotalBytes <= 2<<20 || at.TotalBytes != f.Bytes {
			t.Errorf("%s: max seq %d (%d bytes), next %d bytes; budget %d", f.Variant, f.Max, at.TotalBytes, above.TotalBytes, 2<<20)
		}
	}
	if fits[1].Max < fits[0].Max {
		t.Errorf("approx-act+ms-norm fits a shorter sequence (%d) than plain (%d)", fits[1].Max, fits[0].Max)
	}
}

// TestPlanRefusesHugeSequences: a sequence length past MaxSeq (a typo such as 100000000) is refused before
// the step is built, naming the bound.
func TestPlanRefusesHugeSequences(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	cfg := finetune.Defaults()
	model, shp, err := ShapeModel("llama:tiny", cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []int{-5, 0, 100000000} {
		if _, err := Step(backend, model, shp, cfg, finetune.Shape{Batch: 1, Seq: seq}); err == nil || !strings.Contains(err.Error(), "1048576") {
			t.Errorf("seq %d: %v", seq, err)
		}
	}
	if _, err := Capacities(backend, CapacityRequest{Model: "llama:tiny", Config: cfg, Shape: finetune.Shape{Batch: 1, Seq: 8}, Axis: "seq", Budget: 1 << 30, Limit: 100000000, Variants: finetune.Variants[:1]}); err == nil {
		t.Error("Capacities up to 1e8 tokens accepted")
	}
}
