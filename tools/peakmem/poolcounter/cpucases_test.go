package poolcounter_test

import (
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/bench"
)

// TestCPUComparisonCases checks the gradient steps of the CPU comparison (`finetune bench cpu`, bench.CPUCases:
// (a) the ViT-Ti-shaped encoder, full fine-tuning, batch 16; (b) pretrained/llama-tiny, LoRA on every linear
// layer, batch 8 x 256; (c) the hidden-256 LLaMA, LoRA on every linear layer, batch 4 x 256) at the
// benchmark's default settings, in memfit's plain and approx-act+ms-norm variants: the simulation the benchmark
// reports equals the pool counter to the byte (parallelism=1).
func TestCPUComparisonCases(t *testing.T) {
	if testing.Short() {
		t.Skip("the CPU comparison's full-size steps take a while")
	}
	dir := t.TempDir()
	cases, err := bench.CPUCases(dir, filepath.Join("..", "..", "..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	s := bench.DefaultCPUSettings()
	for _, c := range cases {
		batchFile := filepath.Join(dir, c.Tag()+".batch")
		if err := bench.WriteCPUBatch(c, s, batchFile); err != nil {
			t.Fatal(err)
		}
		b, err := bench.ReadCPUBatch(batchFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"plain", "approx-act+ms-norm"} {
			cfg, err := s.Config(c, v)
			if err != nil {
				t.Fatal(err)
			}
			checkTrainerStep(t, "cpu-"+c.Tag()+"/"+v, c.Model, cfg, b)
		}
		for _, x := range b {
			x.MustFinalizeAll()
		}
	}
}
