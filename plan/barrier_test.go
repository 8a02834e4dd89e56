package plan

import (
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/quant"
)

// TestRecomputationsSurvive: every place where a backward pass rebuilds a forward value instead of keeping it
// reads its inputs through an optimization barrier, and the pure-Go backend, which de-duplicates identical
// nodes, really runs the recomputation twice (forward and backward) instead of keeping the forward value: the
// GELU and SiLU gates of the plain activations, the memory-efficient attention's scores and probabilities,
// QLoRA's dequantised weights, Mesa's dequantised activations, the gated product rebuilt
// under approx-act, and gradient checkpointing's recomputed blocks.
func TestRecomputationsSurvive(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	for _, tc := range []struct {
		name, model string
		shape       finetune.Shape
		change      func(*finetune.Config)
		// want: backend op -> count it must reach (forward + backward recomputation)
		want map[string]int
		// barriered: "prefix*suffix" of the parameters that must all be read through a barrier
		barriered string
	}{
		{"vit plain (GELU, memory-efficient attention, loss)", "vit:tiny", finetune.Shape{Batch: 2}, func(c *finetune.Config) {},
			// 2 layers: the fused GELU forward, and its gradient (which recomputes the gate from x read through a
			// barrier) in one fused op; two fused softmaxes per layer, one in the loss.
			map[string]int{"FusedActivation": 2, "FusedActivationVJP": 2, "FusedSoftmax": 5}, ""},
		{"llama plain (SiLU)", "llama:tiny", finetune.Shape{Batch: 2, Seq: 8}, func(c *finetune.Config) {},
			map[string]int{"FusedActivation": 2, "FusedActivationVJP": 2, "FusedSoftmax": 5}, ""},
		{"llama qlora", "llama:tiny", finetune.Shape{Batch: 2, Seq: 8}, func(c *finetune.Config) { c.Method = finetune.MethodQLoRA },
			// (layer 0's q, k, v pass no gradient on to the frozen embeddings: their weights are not rebuilt)
			nil, "model.layers.1.*" + quant.SuffixCodes},
		{"llama approx-act (gated product rebuilt)", "llama:tiny", finetune.Shape{Batch: 2, Seq: 8}, func(c *finetune.Config) { c.ApproxAct = true },
			// SiLU once per layer in the forward pass (the gated product s*u is rebuilt from s and u, not from the
			// gate), and no exact SiLU gradient
			map[string]int{"FusedActivation": 2, "FusedActivationVJP": 0}, ""},
		{"llama mesa", "llama:tiny", finetune.Shape{Batch: 2, Seq: 8}, func(c *finetune.Config) { c.Mesa = []string{"all"} },
			nil, ""},
		{"vit grad-ckpt", "vit:tiny", finetune.Shape{Batch: 2}, func(c *finetune.Config) { c.GradCkpt = true },
			// the recomputed blocks run GELU and the softmax again; the memory-efficient backward once more.
			map[string]int{"FusedActivation": 4, "FusedActivationVJP": 2, "FusedSoftmax": 7}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := finetune.Defaults()
			cfg.LoRATarget = []string{"all-linear"}
			cfg.Attention = "memory-efficient"
			tc.change(&cfg)
			labels := 3
			model, shp, err := ShapeModel(tc.model, cfg, labels)
			if err != nil {
				t.Fatal(err)
			}
			step, err := gradientStep(backend, model, shp, cfg, tc.shape)
			if err != nil {
				t.Fatal(err)
			}
			g := step.Graph
			defer g.Finalize()
			barriers := 0
			for _, n := range g.Nodes() {
				if n != nil && n.Type() == graph.NodeTypeOptimizationBarrier {
					barriers++
				}
			}
			if barriers == 0 {
				t.Fatalf("no optimization barrier in the training step")
			}
			if tc.barriered != "" {
				read := map[*graph.Node]bool{}
				for _, n := range g.Nodes() {
					if n != nil && n.Type() == graph.NodeTypeOptimizationBarrier {
						for _, in := range n.Inputs() {
							read[in] = true
						}
					}
				}
				found := 0
				for _, n := range g.Nodes() {
					prefix, suffix, _ := strings.Cut(tc.barriered, "*")
					name := ""
					if n != nil && n.Type() == graph.NodeTypeParameter {
						name = n.GetParameterName()
					}
					if strings.HasPrefix(name, prefix) && strings.HasSuffix(name, suffix) {
						found++
						if !read[n] {
							t.Errorf("parameter %s is not read through a barrier", n.GetParameterName())
						}
					}
				}
				if found == 0 {
					t.Errorf("no parameter matches %q", tc.barriered)
				}
			}
			ops, err := memory.ExecutorOps(g)
			if err != nil {
				t.Fatal(err)
			}
			for op, n := range tc.want {
				if ops[op] != n {
					t.Errorf("the backend runs %d %s, want %d (forward and backward): %v", ops[op], op, n, ops)
				}
			}
			t.Logf("%d barriers; backend ops %v", barriers, ops)
		})
	}
}
