package cli_test

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

// TestBadInputSweepGGUF runs issue 31's bad commands (GGUF export and GGUF models) through the CLI, in the style
// of TestBadInputSweepOutputs: each must end with a non-zero exit and one line "finetune: ..." naming the cause,
// with no panic text, and leave every file of the test's folder byte for byte as it was, with no new one. The
// cases are listed in docs/reliability.md.
func TestBadInputSweepGGUF(t *testing.T) {
	tmp := t.TempDir()
	p := func(parts ...string) string { return filepath.Join(append([]string{tmp}, parts...)...) }
	model, alpaca := p("model"), p("adapter")
	copyTree(t, filepath.Join("..", "pretrained", "llama-tiny"), model)
	copyTree(t, filepath.Join("..", "pretrained", "llama-tiny-alpaca"), alpaca)
	vit := p("vit")
	copyTree(t, filepath.Join("..", "pretrained", "vit-fashion"), vit)
	runDir := p("run")
	mustRun(t, "train", "--model", model, "--data", storyText(t, tmp), "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--out", runDir)
	good := p("good.gguf")
	mustRun(t, "export", "--model", model, "--format", "gguf", "--gguf-type", "q8_0", "--out", good)
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	// A run whose base model is gone (its run.yaml names a folder that does not exist).
	copyTree(t, runDir, p("orphan"))
	spec, _ := os.ReadFile(filepath.Join(runDir, "run.yaml"))
	os.WriteFile(p("orphan", "run.yaml"), []byte(strings.Replace(string(spec), model, p("gone"), 1)), 0o644)
	os.MkdirAll(p("norun"), 0o755)
	// GGUF files: cut short, not GGUF at all, a header declaring 2^62 tensors, another architecture.
	os.WriteFile(p("cut.gguf"), data[:len(data)/2], 0o644)
	os.WriteFile(p("text.gguf"), []byte("this is not a model\n"), 0o644)
	huge := append([]byte(nil), data...)
	binary.LittleEndian.PutUint64(huge[8:], math.MaxUint64>>2)
	os.WriteFile(p("huge.gguf"), huge, 0o644)
	other := append([]byte(nil), data...)
	if i := strings.Index(string(other), "llama"); i > 0 {
		copy(other[i:], "mamba") // an architecture memfit does not read
	}
	os.WriteFile(p("other.gguf"), other, 0o644)
	os.WriteFile(p("earlier.gguf"), []byte("GGUF"), 0o644)
	inputs := p("inputs.json")
	os.WriteFile(inputs, []byte(`{"input_ids": [[1, 312, 45, 1907]]}`), 0o644)
	gguf := func(extra ...string) []string {
		return append([]string{"export", "--format", "gguf"}, extra...)
	}

	cases := []struct {
		args []string
		want string
	}{
		{gguf("--model", vit, "--out", p("vit.gguf")), "GGUF export is for the families llama.cpp and Ollama run ("},
		{gguf("--model", filepath.Join(golden.SharedDir(t), "golden", "llama_c"), "--out", p("cls.gguf")), "GGUF export is for causal LMs; this model is a LLaMA sequence classifier"},
		{gguf("--run", p("orphan"), "--out", p("o.gguf")), "the run's base model " + p("gone") + " is not there"},
		{gguf("--run", p("norun"), "--out", p("n.gguf")), "is not a training output folder"},
		{gguf("--run", runDir, "--out", p("q.gguf"), "--gguf-type", "q4_k"), `--gguf-type "q4_k": use f32, f16, bf16 or q8_0`},
		{gguf("--run", runDir, "--checkpoint", "99", "--out", p("q.gguf")), "--checkpoint 99: " + runDir + " has no checkpoint of step 99"},
		{gguf("--run", runDir, "--checkpoint", "best", "--out", p("q.gguf")), "has no best checkpoint"},
		{gguf("--run", runDir, "--out", p("x.bin")), "a GGUF export is one file: give a name ending in .gguf"},
		{gguf("--run", runDir, "--out", p("earlier.gguf")), "already exists: pass --overwrite"},
		{gguf("--run", runDir, "--model", model, "--out", p("y.gguf")), "give one of them"},
		{gguf("--out", p("y.gguf")), "give one of them"},
		{gguf("--run", runDir, "--adapter", alpaca, "--out", p("y.gguf")), "--adapter goes with --model"},
		{gguf("--model", good, "--out", p("y.gguf")), "is a GGUF file already"},
		{gguf("--model", model, "--out", p("missing", "y.gguf")), "does not exist"},
		{[]string{"export", "--run", runDir, "--format", "merged", "--gguf-type", "f16", "--out", p("m")}, "--gguf-type goes with --format gguf"},
		{[]string{"export", "--run", runDir, "--format", "onnx", "--out", p("m")}, "--format must be peft, merged or gguf"},
		{[]string{"generate", "--model", p("cut.gguf"), "--prompt", "Hi"}, "is truncated"},
		{[]string{"generate", "--model", p("text.gguf"), "--prompt", "Hi"}, "not a GGUF file"},
		{[]string{"generate", "--model", p("huge.gguf"), "--prompt", "Hi"}, "more than the file's"},
		{[]string{"generate", "--model", p("other.gguf"), "--prompt", "Hi"}, `general.architecture is "mamba": memfit reads GGUF files of the architectures [gemma2 gemma3 llama phi3 qwen2 qwen3]`},
		{[]string{"logits", "--model", p("cut.gguf"), "--inputs", inputs}, "is truncated"},
		{[]string{"logits", "--model", p("missing.gguf"), "--inputs", inputs}, "no such file"},
		{[]string{"generate", "--model", p("run", "run.yaml"), "--prompt", "Hi"}, "a model is a folder (config.json and its safetensors)"},
		{[]string{"train", "--model", good, "--data", filepath.Join(tmp, "story.txt"), "--out", p("t")}, "is a GGUF file: training starts from a Hugging Face model folder"},
	}
	for _, c := range cases {
		refusedUnchanged(t, tmp, c.args, c.want)
	}
	t.Logf("%d bad commands, each refused with one line, nothing changed", len(cases))
	// --overwrite replaces an earlier GGUF export and its Modelfile; --checkpoint names a step.
	if _, stderr, code := run(t, gguf("--run", runDir, "--checkpoint", "1", "--out", p("earlier.gguf"), "--overwrite")...); code != 0 {
		t.Errorf("export --overwrite: exit %d: %s", code, stderr)
	}
}
