package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestQLoRAAndMesaThroughTheCLI trains the shipped tiny LLaMA with QLoRA + MS-RMSNorm + ReSiLU2 and Mesa on
// packed text, exports the merged model (into the dequantised base) and reads its logits.
func TestQLoRAAndMesaThroughTheCLI(t *testing.T) {
	tmp := t.TempDir()
	text := filepath.Join(tmp, "text.txt")
	os.WriteFile(text, []byte(strings.Repeat("The quick brown fox jumps over the lazy dog.\n\nPack my box with five dozen liquor jugs.\n\n", 40)), 0o644)
	model := filepath.Join("..", "pretrained", "llama-tiny")
	out := filepath.Join(tmp, "run")
	_, errOut, code := run(t, "train", "--model", model, "--data", text, "--seq-len", "32", "--out", out, "--method", "qlora",
		"--lora-targets", "all-linear", "--ms-norm", "--approx-act", "--mesa", "norm,softmax", "--steps", "3", "--batch-size", "4",
		"--lr", "1e-3")
	if code != 0 {
		t.Fatalf("train: exit %d: %s", code, errOut)
	}
	lines := readMetrics(t, filepath.Join(out, "metrics.jsonl"))
	if len(lines) == 0 || lines[len(lines)-1]["step"].(float64) != 3 {
		t.Fatalf("metrics %v", lines)
	}
	merged := filepath.Join(tmp, "merged")
	if _, errOut, code := run(t, "export", "--run", out, "--format", "merged", "--out", merged); code != 0 {
		t.Fatalf("export: %s", errOut)
	}
	inputs := filepath.Join(tmp, "in.json")
	os.WriteFile(inputs, []byte(`{"input_ids": [[4093, 39, 442, 78]]}`), 0o644)
	if out, errOut, code := run(t, "logits", "--model", merged, "--inputs", inputs); code != 0 || !strings.HasPrefix(out, `{"logits": [[[`) {
		t.Fatalf("logits of the merged QLoRA model: exit %d, %s", code, errOut)
	}
	mem, errOut, code := run(t, "memory", "--model", model, "--method", "qlora", "--lora-targets", "all-linear", "--batch-size", "2",
		"--seq-len", "32", "--variants", "plain,mesa")
	if code != 0 || !strings.Contains(mem, "NF4 base") || !strings.Contains(mem, "mesa") {
		t.Errorf("memory --method qlora: exit %d, %s%s", code, mem, errOut)
	}
}
