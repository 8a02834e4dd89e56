package all_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
)

// TestFamilyVariants: decoder configurations beyond the shared goldens (testdata/variants.py: Qwen2 sliding layers
// from max_window_layers in a 4.4x config without layer_types, untied; Qwen3 with attention biases and linear
// rope scaling in transformers 5's layout (dtype, rope_parameters); Mistral with its own head_dim and no window;
// Gemma 2 with other caps, window and query scalar; Gemma 3 with linear rope scaling on its full layers; Phi-3
// longrope past and within its original context, with a window) made by the same plain-PyTorch reference of
// transformers 4.55.4 (families_reference.py in ../shared/data/golden), run here where Debian's python3-torch is
// installed: memfit's logits, loss and decoded last logits within 1e-4 of the reference.
func TestFamilyVariants(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch, numpy").Run(); err != nil {
		t.Skipf("no torch in %s (Debian's python3-torch): %v", py, err)
	}
	shared := filepath.Join(golden.SharedDir(t), "golden")
	out := t.TempDir()
	cmd := exec.Command(py, filepath.Join("testdata", "variants.py"), shared, out)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("variants.py: %v\n%s", err, b)
	}
	entries, err := os.ReadDir(out)
	if err != nil || len(entries) < 7 {
		t.Fatalf("variants: %v, %d folders", err, len(entries))
	}
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) {
			dir := filepath.Join(out, e.Name())
			g := golden.LoadDir(t, dir)
			fam, err := finetune.FamilyOfFolder(dir)
			if err != nil || !strings.HasPrefix(strings.ReplaceAll(e.Name(), "gemma3", "gemma3_text"), fam.Name) {
				t.Fatalf("family of %s: %q, %v", e.Name(), fam.Name, err)
			}
			model, err := finetune.LoadModel(dir, finetune.Defaults())
			if err != nil {
				t.Fatal(err)
			}
			logits, loss, _, decoded, _ := goldenRun(t, model, g, nil)
			want := g.Array(t, "outputs", "logits").Float32s()
			if d := golden.RelMaxDiff(logits, want); d > 1e-4 {
				t.Errorf("logits differ from the reference by %g (relative)", d)
			} else {
				t.Logf("logits rel diff %.2g", d)
			}
			if want := g.Array(t, "outputs", "loss").Values[0]; abs(float64(loss[0])-want) > 1e-5*max(1, abs(want)) {
				t.Errorf("loss %g, reference %g", loss[0], want)
			}
			if d := golden.RelMaxDiff(decoded, lastLogits(t, g, want)); d > 1e-4 {
				t.Errorf("decoding through the cache: last logits differ by %g (relative)", d)
			}
		})
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
