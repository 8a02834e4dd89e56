package all_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/adaptertest"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
)

// tokenExamples are 8 rows of 12 tokens from a small recurrence (below every golden's vocabulary): text a model
// learns within a few steps.
func tokenExamples() finetune.Examples {
	const n, seq = 8, 12
	ids := make([]int32, n*seq)
	mask := make([]int32, n*seq)
	for i := 0; i < n; i++ {
		tok := int32(i*5 + 3)
		for j := 0; j < seq; j++ {
			ids[i*seq+j], mask[i*seq+j] = tok, 1
			tok = (7*tok + 11) % 97
		}
	}
	return finetune.Examples{"input_ids": tensors.FromFlatDataAndDimensions(ids, n, seq),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, n, seq),
		"labels":         tensors.FromFlatDataAndDimensions(append([]int32(nil), ids...), n, seq)}
}

// TestFamilyMethods: every training method and memory mode runs on the decoder families (each case a family's
// golden model, so every family takes several methods and every method several families): the loss falls over
// six steps; the PEFT export (Phi-3's fused qkv_proj and gate_up_proj its targets, as PEFT adapts them) read into
// the model loaded anew, and the merged export, give the trainer's logits. QLoRA's base is NF4 (its merged export dequantised);
// full fine-tuning has no adapter to export.
func TestFamilyMethods(t *testing.T) {
	for _, tc := range []struct {
		golden, name string
		edit         func(c *finetune.Config)
	}{
		{"qwen2_a", "qlora+approx-act+ms-norm", func(c *finetune.Config) { c.Method, c.ApproxAct, c.MSNorm = finetune.MethodQLoRA, true, true }},
		{"qwen3_a", "lora-fa+mesa", func(c *finetune.Config) { c.Method, c.Mesa = finetune.MethodLoRAFA, []string{"all"} }},
		{"mistral_a", "full+grad-ckpt", func(c *finetune.Config) { c.Method, c.GradCkpt = finetune.MethodFull, true }},
		{"gemma2_a", "qlora+grad-ckpt+memory-efficient", func(c *finetune.Config) {
			c.Method, c.GradCkpt, c.Attention = finetune.MethodQLoRA, true, "memory-efficient"
		}},
		{"gemma3_a", "lora+block-plan", func(c *finetune.Config) { c.BlockPlan, c.MSNorm = "grad-ckpt,approx-act+mesa-softmax,plain", true }},
		{"phi3_a", "lora-fa+approx-act+ms-norm+mesa", func(c *finetune.Config) {
			c.Method, c.ApproxAct, c.MSNorm, c.Mesa = finetune.MethodLoRAFA, true, true, []string{"act", "linear"}
		}},
		{"phi3_a", "full+approx-act", func(c *finetune.Config) { c.Method, c.ApproxAct = finetune.MethodFull, true }},
	} {
		t.Run(tc.golden+"/"+tc.name, func(t *testing.T) {
			dir := filepath.Join(golden.SharedDir(t), "golden", tc.golden)
			cfg := finetune.Defaults()
			cfg.LoRATarget, cfg.Steps, cfg.LR, cfg.LogEvery, cfg.Seed = []string{"all-linear"}, 6, 1e-2, 1, 3
			tc.edit(&cfg)
			if cfg.Method == finetune.MethodFull {
				cfg.LoRARank, cfg.LoRATarget, cfg.LR = 0, nil, 1e-3
			}
			model, err := finetune.LoadModel(dir, cfg)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := finetune.New(model, cfg, gtest.Backend(t))
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Release()
			data := tokenExamples()
			loader, err := finetune.NewLoader(data, 4, cfg.Seed, true)
			if err != nil {
				t.Fatal(err)
			}
			var losses []float64
			if err := tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{OnStep: func(s finetune.StepStats) { losses = append(losses, s.Loss) }}); err != nil {
				t.Fatal(err)
			}
			t.Logf("losses %.4f", losses)
			if len(losses) != 6 || !(losses[5] < losses[0]) {
				t.Errorf("the loss did not fall: %v", losses)
			}
			batch := finetune.Batch{}
			for k, v := range data {
				batch[k] = v
			}
			want, err := tr.Logits(batch)
			if err != nil {
				t.Fatal(err)
			}
			wantV := gtest.Float32s(want)
			if cfg.Method != finetune.MethodFull {
				adapterDir := filepath.Join(t.TempDir(), "adapter")
				if err := tr.ExportAdapter(adapterDir, dir); err != nil {
					t.Fatal(err)
				}
				freshCfg := finetune.Defaults()
				freshCfg.Method = cfg.Method // QLoRA's adapter over the same NF4 base
				fresh, err := finetune.LoadModel(dir, freshCfg)
				if err != nil {
					t.Fatal(err)
				}
				if d := gtest.MaxRelDiff(adaptertest.Logits(t, fresh, adapterDir, batch), wantV, 1); d > 1e-5 {
					t.Errorf("PEFT adapter read into a fresh model: logits differ by %g", d)
				}
				if targets := peftTargets(t, adapterDir); tc.golden == "phi3_a" && (!endsIn(targets, ".self_attn.qkv_proj") ||
					!endsIn(targets, ".mlp.gate_up_proj") || endsIn(targets, ".q_proj") || endsIn(targets, ".gate_proj")) {
					t.Errorf("Phi-3's PEFT target_modules %v: want the fused qkv_proj and gate_up_proj, as PEFT adapts them", targets)
				}
			}
			// The merged export of a QLoRA run holds the dequantised base plus the adapters: the trainer's logits.
			mergedDir := filepath.Join(t.TempDir(), "merged")
			if err := tr.ExportMerged(mergedDir); err != nil {
				t.Fatal(err)
			}
			merged, err := finetune.LoadModel(mergedDir, finetune.Defaults())
			if err != nil {
				t.Fatal(err)
			}
			got, err := finetune.Logits(gtest.Backend(t), merged, nil, nil, batch)
			if err != nil {
				t.Fatal(err)
			}
			if d := gtest.MaxRelDiff(gtest.Float32s(got), wantV, 1); d > 1e-5 {
				t.Errorf("merged export: logits differ by %g", d)
			}
		})
	}
}

// peftTargets reads target_modules of the adapter_config.json in dir.
func peftTargets(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		TargetModules []string `json:"target_modules"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c.TargetModules
}

// endsIn reports whether a module path of list ends in suffix.
func endsIn(list []string, suffix string) bool {
	return slices.ContainsFunc(list, func(p string) bool { return strings.HasSuffix(p, suffix) })
}
