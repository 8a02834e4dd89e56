package poolcounter_test

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	_ "github.com/memfit/memfit/family/all" // the families finetune.LoadModel loads
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
)

// tinyCheckpoints writes random tiny ViT (3 classes) and LLaMA checkpoints, as finetune.LoadModel reads them.
func tinyCheckpoints(t *testing.T) (vitDir, llamaDir string) {
	t.Helper()
	vcfg, err := vit.Preset("tiny", 3)
	if err != nil {
		t.Fatal(err)
	}
	vj, _ := vcfg.JSON()
	vitDir = filepath.Join(t.TempDir(), "vit")
	if err := models.SaveCheckpoint(vitDir, vj, vit.RandomParams(vcfg, 11), 0); err != nil {
		t.Fatal(err)
	}
	lcfg, err := llama.Preset("tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	lj, _ := llama.JSON(lcfg)
	llamaDir = filepath.Join(t.TempDir(), "llama")
	if err := models.SaveCheckpoint(llamaDir, lj, decoder.RandomParams(lcfg, 12), 0); err != nil {
		t.Fatal(err)
	}
	return vitDir, llamaDir
}

// imageBatch is a batch of random images for a ViT with the given config.
func imageBatch(c vit.Config, batch, classes int) finetune.Batch {
	r := rand.New(rand.NewPCG(3, 4))
	px := make([]float32, batch*c.NumChannels*c.ImageSize*c.ImageSize)
	for i := range px {
		px[i] = float32(r.NormFloat64())
	}
	labels := make([]int32, batch)
	for i := range labels {
		labels[i] = int32(i % classes)
	}
	return finetune.Batch{
		"pixel_values": tensors.FromFlatDataAndDimensions(px, batch, c.NumChannels, c.ImageSize, c.ImageSize),
		"labels":       tensors.FromFlatDataAndDimensions(labels, batch),
	}
}

// textBatch is a batch of token sequences for the tiny LLaMA (vocabulary 64 and up).
func textBatch(batch, seq int) finetune.Batch {
	ids := make([]int32, batch*seq)
	mask := make([]int32, batch*seq)
	for i := range ids {
		ids[i] = int32((7*i + 3) % 64)
		mask[i] = 1
	}
	return finetune.Batch{
		"input_ids":      tensors.FromFlatDataAndDimensions(ids, batch, seq),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, batch, seq),
		"labels":         tensors.FromFlatDataAndDimensions(append([]int32(nil), ids...), batch, seq),
	}
}

// stepArgs lays out the trainer's tensors in the order of the gradient step's parameters, by their names
// (finetune/step.go: "batch.<name>", "rng", the frozen and trained tensors by name, "mesa.<n>").
func stepArgs(t *testing.T, g *graph.Graph, tr *finetune.Trainer, b finetune.Batch) []*tensors.Tensor {
	t.Helper()
	args := make([]*tensors.Tensor, g.NumParameters())
	for i := range args {
		name := g.GetParameterByHandle(graph.ParameterHandle(i)).GetParameterName()
		switch {
		case strings.HasPrefix(name, "batch."):
			args[i] = b[strings.TrimPrefix(name, "batch.")]
		case name == "rng":
			args[i] = tr.RNG
		case tr.Frozen[name] != nil:
			args[i] = tr.Frozen[name]
		case tr.Train[name] != nil:
			args[i] = tr.Train[name]
		case strings.HasPrefix(name, "m.") && tr.M[strings.TrimPrefix(name, "m.")] != nil:
			args[i] = tr.M[strings.TrimPrefix(name, "m.")]
		case strings.HasPrefix(name, "v.") && tr.V[strings.TrimPrefix(name, "v.")] != nil:
			args[i] = tr.V[strings.TrimPrefix(name, "v.")]
		case name == "ok":
			args[i] = tensors.FromScalar(true)
		case name == "lr" || name == "bias_correction1" || name == "bias_correction2":
			args[i] = tensors.FromScalar(float32(0.5))
		case strings.HasPrefix(name, "mesa."):
			if k, err := strconv.Atoi(strings.TrimPrefix(name, "mesa.")); err == nil && k < len(tr.Mesa) {
				args[i] = tr.Mesa[k]
			}
		}
		if args[i] == nil {
			t.Fatalf("no trainer tensor for the step's parameter %d %q", i, name)
		}
	}
	return args
}

// checkTrainerStep builds the trainer's gradient step for b and checks that the simulation's transient peak
// equals the counter's, to the byte, for a warm run on the trainer's own tensors (the inputs' resident bytes
// are checked by the synthetic cases, which transfer them inside the run).
func checkTrainerStep(t *testing.T, name, dir string, cfg finetune.Config, b finetune.Batch) {
	t.Helper()
	model, err := finetune.LoadModel(dir, cfg)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	tr, err := finetune.New(model, cfg, backendFor(t, one1))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	g, err := tr.StepGraph(b)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	sim, err := memory.SimulatePeak(g, memory.SimOptions{})
	if err != nil {
		t.Fatalf("%s: SimulatePeak: %v", name, err)
	}
	measured := warmTransient(t, name, g, stepArgs(t, g, tr, b), sim.Kept)
	t.Logf("%-44s counter transient %9d | simulation transient %9d (peak %9d, resident %9d) | diff %+d",
		name, measured, sim.Transient(), sim.Bytes, sim.Resident, sim.Transient()-measured)
	if measured != sim.Transient() {
		t.Errorf("%s: counter transient %d, simulation %d: off by %+d", name, measured, sim.Transient(), sim.Transient()-measured)
	}
}

// TestAgreementFinetuneSteps: the gradient steps memfit trains, built by finetune.Trainer for tiny ViT and
// LLaMA models (LoRA on every linear layer) in every memory-saving variant (finetune.Variants: plain,
// ReGELU2/ReSiLU2, MS-norm, both, gradient checkpointing, Mesa int8, both + Mesa softmax), QLoRA (NF4 base)
// plain and with both, LoRA-FA and full fine-tuning.
func TestAgreementFinetuneSteps(t *testing.T) {
	vitDir, llamaDir := tinyCheckpoints(t)
	vcfg, _ := vit.Preset("tiny", 3)
	batches := map[string]finetune.Batch{"vit": imageBatch(vcfg, 4, 3), "llama": textBatch(4, 16)}
	dirs := map[string]string{"vit": vitDir, "llama": llamaDir}
	for _, m := range []string{"vit", "llama"} {
		for _, method := range []string{finetune.MethodLoRA, finetune.MethodQLoRA, finetune.MethodLoRAFA, finetune.MethodFull} {
			for _, v := range finetune.Variants {
				if method != finetune.MethodLoRA && v.Name != "plain" && v.Name != "approx-act+ms-norm" {
					continue
				}
				if method == finetune.MethodFull && v.Name != "plain" {
					continue
				}
				cfg := finetune.Defaults()
				cfg.Method = method
				cfg.LoRATarget = []string{"all-linear"}
				if method == finetune.MethodFull {
					cfg.LoRARank, cfg.LoRATarget = 0, nil
				}
				cfg = v.Apply(cfg)
				checkTrainerStep(t, fmt.Sprintf("%s/%s/%s", m, method, v.Name), dirs[m], cfg, batches[m])
			}
		}
	}
}
