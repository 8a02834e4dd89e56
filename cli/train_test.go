package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/safetensors"
)

// writeImageData writes a tiny 3-class image dataset as safetensors.
func writeImageData(t *testing.T, path string, n int) {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	px := make([]float32, n*3*32*32)
	labels := make([]int32, n)
	for i := 0; i < n; i++ {
		c := i % 3
		labels[i] = int32(c)
		for ch := 0; ch < 3; ch++ {
			for k := 0; k < 1024; k++ {
				v := float32(r.NormFloat64() * 0.3)
				if ch == c {
					v++
				}
				px[(i*3+ch)*1024+k] = v
			}
		}
	}
	err := safetensors.WriteTensors(path, map[string]*tensors.Tensor{
		"pixel_values": tensors.FromFlatDataAndDimensions(px, n, 3, 32, 32),
		"labels":       tensors.FromFlatDataAndDimensions(labels, n),
	}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
}

func readMetrics(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("metrics line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	return lines
}

// TestTrainExportResume runs the whole CLI path: init a tiny ViT, train LoRA with the memory-saving options
// from a YAML config plus flags, check metrics, resume to more steps, export PEFT and merged, and get logits
// from the merged model.
func TestTrainExportResume(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join(tmp, "vit")
	if _, e, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", model); code != 0 {
		t.Fatal(e)
	}
	data := filepath.Join(tmp, "train.safetensors")
	writeImageData(t, data, 24)
	cfgFile := filepath.Join(tmp, "train.yaml")
	os.WriteFile(cfgFile, []byte("method: lora\nlora_r: 4\nlora_targets: [q, v]\ntrain_modules: [classifier]\nlr: 0.003\nbatch_size: 6\nlog_every: 1\n"), 0o644)
	out := filepath.Join(tmp, "run")
	stdout, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", out, "--config", cfgFile,
		"--steps", "6", "--approx-act", "--ms-norm", "--checkpoint-every", "3")
	if code != 0 {
		t.Fatalf("train exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "# resolved run") || !strings.Contains(stderr, "approx_act: true") || !strings.Contains(stderr, "lora_r: 4") {
		t.Errorf("resolved config not printed as expected:\n%s", stderr)
	}
	if !strings.Contains(stdout, "adapter written") {
		t.Errorf("stdout %q", stdout)
	}
	lines := readMetrics(t, filepath.Join(out, "metrics.jsonl"))
	if len(lines) != 6 {
		t.Fatalf("%d metrics lines, want 6", len(lines))
	}
	for _, key := range []string{"step", "loss", "lr", "grad_norm", "examples", "seconds", "saved_activation_bytes", "peak_bytes", "peak_method"} {
		if _, ok := lines[0][key]; !ok {
			t.Errorf("metrics lack %q: %v", key, lines[0])
		}
	}
	for _, f := range []string{"run.yaml", "latest", "checkpoint-3/trainer_state.json", "checkpoint-6/trainable.safetensors", "adapter/adapter_config.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing %s", f)
		}
	}
	// Resume to 9 steps.
	if _, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "9"); code != 0 {
		t.Fatalf("resume exit %d: %s", code, stderr)
	}
	if lines := readMetrics(t, filepath.Join(out, "metrics.jsonl")); len(lines) != 9 || lines[8]["step"].(float64) != 9 {
		t.Errorf("after resume: %d metrics lines", len(lines))
	}
	// Export both ways; the merged model loads as a plain checkpoint.
	merged := filepath.Join(tmp, "merged")
	if _, stderr, code := run(t, "export", "--run", out, "--format", "merged", "--out", merged); code != 0 {
		t.Fatalf("export merged: %s", stderr)
	}
	if _, stderr, code := run(t, "export", "--run", out, "--format", "peft", "--out", filepath.Join(tmp, "peft")); code != 0 {
		t.Fatalf("export peft: %s", stderr)
	}
	inputs := filepath.Join(tmp, "in.json")
	px := make([][][][]float32, 1)
	px[0] = make([][][]float32, 3)
	for c := range px[0] {
		px[0][c] = make([][]float32, 32)
		for y := range px[0][c] {
			px[0][c][y] = make([]float32, 32)
		}
	}
	raw, _ := json.Marshal(map[string]any{"pixel_values": px})
	os.WriteFile(inputs, raw, 0o644)
	mergedOut, stderr, code := run(t, "logits", "--model", merged, "--inputs", inputs)
	if code != 0 {
		t.Fatalf("logits of the merged model: %s", stderr)
	}
	// The base model with the PEFT adapter (and its trained classifier) gives the merged model's logits.
	adapterOut, stderr, code := run(t, "logits", "--model", model, "--adapter", filepath.Join(tmp, "peft"), "--inputs", inputs)
	if code != 0 {
		t.Fatalf("logits with --adapter: %s", stderr)
	}
	var a, b struct{ Logits [][]float64 }
	json.Unmarshal([]byte(mergedOut), &a)
	json.Unmarshal([]byte(adapterOut), &b)
	if len(a.Logits) != 1 || len(b.Logits) != 1 || len(a.Logits[0]) != len(b.Logits[0]) {
		t.Fatalf("logits %v / %v", a.Logits, b.Logits)
	}
	for i := range a.Logits[0] {
		if d := a.Logits[0][i] - b.Logits[0][i]; d > 1e-4 || d < -1e-4 {
			t.Errorf("logit %d: merged %g, base + adapter %g", i, a.Logits[0][i], b.Logits[0][i])
		}
	}
}

// TestTrainBadInput: contradictory or invalid settings are usage errors (exit 2), bad data a failure (exit 1),
// each one line, before any training.
func TestTrainBadInput(t *testing.T) {
	tmp, model, data := vitFixture(t)
	badYAML := filepath.Join(tmp, "bad.yaml")
	os.WriteFile(badYAML, []byte("method: lora\nlearning_rate: 0.1\n"), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--method", "full", "--lora-r", "8"}, 2, "takes no lora_r"},
		{[]string{"--lora-r", "0"}, 2, "rank"},
		{[]string{"--lora-targets", "gate_proj"}, 2, "matches no linear layer"},
		{[]string{"--config", badYAML}, 2, "learning_rate"},
		{[]string{"--no-such-flag"}, 2, "unknown flag"},
		{[]string{"--train-modules", "score"}, 2, "train_modules"},
		{[]string{"--batch-size", "100"}, 1, "batch size"},
	} {
		out := filepath.Join(tmp, "run-"+strings.ReplaceAll(tc.args[0], "-", ""))
		args := append([]string{"train", "--model", model, "--data", data, "--out", out, "--steps", "1"}, tc.args...)
		_, stderr, code := run(t, args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != tc.code || !strings.Contains(last, tc.want) || !strings.HasPrefix(last, "finetune: ") {
			t.Errorf("%v: exit %d, last line %q; want exit %d mentioning %q", tc.args, code, last, tc.code, tc.want)
		}
		if _, err := os.Stat(filepath.Join(out, "checkpoint-1")); err == nil {
			t.Errorf("%v: a checkpoint was written", tc.args)
		}
	}
}

// TestTrainGPUDefaults: with --backend xla:cuda the resolved config (printed before anything runs) has bfloat16
// compute and flash attention, a flag or config key keeps the user's value, and the plain backend keeps
// float32 and standard attention. (This build has no XLA or no GPU: the run then stops at the backend, with one
// line.)
func TestTrainGPUDefaults(t *testing.T) {
	tmp, model, data := vitFixture(t)
	cfgFile := filepath.Join(tmp, "f32.yaml")
	os.WriteFile(cfgFile, []byte("compute_dtype: float32\n"), 0o644)
	for i, tc := range []struct {
		args        []string
		dtype, attn string
	}{
		{[]string{"--backend", "xla:cuda"}, "bfloat16", "flash"},
		{[]string{"--backend", "xla:cuda", "--attention", "standard"}, "bfloat16", "standard"},
		{[]string{"--backend", "xla:cuda", "--config", cfgFile}, "float32", "flash"},
		{nil, "float32", "standard"},
	} {
		args := append([]string{"train", "--model", model, "--data", data, "--out", filepath.Join(tmp, fmt.Sprint("run", i)), "--steps", "1", "--dry-run"}, tc.args...)
		stdout, stderr, _ := run(t, args...)
		if !strings.Contains(stdout, "compute_dtype: "+tc.dtype) || !strings.Contains(stdout, "attention: "+tc.attn) {
			t.Errorf("%v: want compute_dtype %s and attention %s in the resolved run:\n%s%s", tc.args, tc.dtype, tc.attn, stdout, stderr)
		}
	}
}

// TestTrainRefusesUsedFolder: a second train into an --out that holds a run is refused (exit 2, one line that
// says how to continue or start over) and changes nothing; --overwrite starts over; the log after a resume has
// each step once.
func TestTrainRefusesUsedFolder(t *testing.T) {
	tmp, model, data := vitFixture(t)
	out := filepath.Join(tmp, "run")
	args := []string{"train", "--model", model, "--data", data, "--out", out, "--steps", "2", "--log-every", "1", "--method", "full"}
	if _, stderr, code := run(t, args...); code != 0 {
		t.Fatalf("first run: exit %d\n%s", code, stderr)
	}
	before, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	_, stderr, code := run(t, append(args, "--lr", "0.5")...)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; code != 2 || !strings.Contains(last, "already holds a training run") || !strings.Contains(last, "--overwrite") {
		t.Errorf("second run: exit %d, last line %q", code, last)
	}
	if after, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl")); string(after) != string(before) {
		t.Errorf("the refused run changed the metrics")
	}
	if _, stderr, code := run(t, append(args, "--overwrite")...); code != 0 {
		t.Fatalf("--overwrite: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "4"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	b, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if n := strings.Count(string(b), "\n"); n != 4 || strings.Count(string(b), `"step":2,`) != 1 {
		t.Errorf("metrics after overwrite and resume (%d lines):\n%s", n, b)
	}
}

// TestResumeRefusesEditedRun: a run.yaml edited after the checkpoint (here its log_every) no longer matches the
// checkpoint: --resume names each difference and trains nothing.
func TestResumeRefusesEditedRun(t *testing.T) {
	tmp, model, data := vitFixture(t)
	out := filepath.Join(tmp, "run")
	if _, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", out, "--steps", "2", "--log-every", "1"); code != 0 {
		t.Fatalf("train: %d %s", code, stderr)
	}
	spec := filepath.Join(out, "run.yaml")
	b, _ := os.ReadFile(spec)
	if !strings.Contains(string(b), "log_every: 1\n") {
		t.Fatalf("run.yaml:\n%s", b)
	}
	os.WriteFile(spec, []byte(strings.Replace(string(b), "log_every: 1\n", "log_every: 3\n", 1)), 0o644)
	_, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "4")
	if code != 1 || !strings.Contains(stderr, "does not match the checkpoint") || !strings.Contains(stderr, "log_every: 3 here, 1 there") {
		t.Errorf("exit %d, %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "checkpoint-4")); err == nil {
		t.Error("the mismatched resume trained")
	}
}

// TestTrainRefusesStepLargerThanMachine: a step whose planned total (peak with weights, plus optimizer state) is
// larger than the machine's memory ($MEMFIT_MEMORY_LIMIT stands in for a small machine) is refused before any
// training, naming both figures; the folder is left usable (the same command then runs).
func TestTrainRefusesStepLargerThanMachine(t *testing.T) {
	tmp, model, data := vitFixture(t)
	out := filepath.Join(tmp, "run")
	args := []string{"train", "--model", model, "--data", data, "--out", out, "--steps", "1", "--method", "full", "--batch-size", "4"}
	t.Setenv("MEMFIT_MEMORY_LIMIT", "1MiB")
	_, stderr, code := run(t, args...)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if code != 1 || !strings.Contains(last, "the training step needs") || !strings.Contains(last, "but this machine has 1.000 MiB") || !strings.Contains(last, "batch 4") {
		t.Fatalf("exit %d, last line %q", code, last)
	}
	if _, err := os.Stat(filepath.Join(out, "metrics.jsonl")); err == nil {
		t.Errorf("the refused run wrote metrics")
	}
	t.Setenv("MEMFIT_MEMORY_LIMIT", "8GiB")
	if _, stderr, code := run(t, args...); code != 0 {
		t.Fatalf("with room: exit %d\n%s", code, stderr)
	}
	t.Setenv("MEMFIT_MEMORY_LIMIT", "lots")
	if _, stderr, _ := run(t, append(args, "--overwrite")...); !strings.Contains(stderr, `$MEMFIT_MEMORY_LIMIT="lots"`) {
		t.Errorf("a bad limit: %s", stderr)
	}
}

// TestResumeRefusesChangedData: --resume checks the data against the checkpoint's (example count and a
// fingerprint of the contents): fewer examples, or as many with other contents, are refused naming the data and
// the difference, with nothing trained; the original data resumes.
func TestResumeRefusesChangedData(t *testing.T) {
	tmp, model, data := vitFixture(t)
	orig, _ := os.ReadFile(data)
	out := filepath.Join(tmp, "run")
	if _, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", out, "--steps", "2", "--batch-size", "4"); code != 0 {
		t.Fatalf("first run: exit %d\n%s", code, stderr)
	}
	writeImageData(t, data, 10)
	_, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "4")
	if code != 1 || !strings.Contains(stderr, "--data "+data) || !strings.Contains(stderr, "it had 12 examples, the data now has 10") {
		t.Errorf("fewer examples: exit %d\n%s", code, stderr)
	}
	changed := append([]byte(nil), orig...)
	changed[len(changed)-100] ^= 1 // one pixel's bit
	os.WriteFile(data, changed, 0o644)
	_, stderr, code = run(t, "train", "--out", out, "--resume", "--steps", "4")
	if code != 1 || !strings.Contains(stderr, "the same number of examples (12) but other contents") {
		t.Errorf("changed contents: exit %d\n%s", code, stderr)
	}
	if n := len(readMetrics(t, filepath.Join(out, "metrics.jsonl"))); n != 1 {
		t.Errorf("the refused resumes changed the metrics: %d lines", n)
	}
	os.WriteFile(data, orig, 0o644)
	if _, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "4"); code != 0 {
		t.Fatalf("resume with the original data: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "1"); code != 2 || !strings.Contains(stderr, "--steps 1 is below the step the checkpoint reached (4)") {
		t.Errorf("--steps below the checkpoint: exit %d\n%s", code, stderr)
	}
}

// TestExportGuards: export never writes into the run's base model, a run folder or a checkpoint (each refused
// with one line, the folder unchanged), and replaces an earlier export only with --overwrite.
func TestExportGuards(t *testing.T) {
	tmp, model, data := vitFixture(t)
	out := filepath.Join(tmp, "run")
	if _, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", out, "--steps", "1"); code != 0 {
		t.Fatalf("train: exit %d\n%s", code, stderr)
	}
	weights, _ := os.ReadFile(filepath.Join(model, "model.safetensors"))
	for _, c := range []struct{ format, out, want string }{
		{"merged", model, "is the run's base model"},
		{"merged", out, "is a training output folder"},
		{"peft", filepath.Join(out, "checkpoint-1"), "is a checkpoint"},
	} {
		_, stderr, code := run(t, "export", "--run", out, "--format", c.format, "--out", c.out)
		if code != 2 || !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("export --out %s: exit %d\n%s", c.out, code, stderr)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(model, "model.safetensors")); string(after) != string(weights) {
		t.Error("the base model's weights changed")
	}
	if _, err := os.Stat(filepath.Join(out, "config.json")); err == nil {
		t.Error("a merged model was written into the run folder")
	}
	merged := filepath.Join(tmp, "merged")
	if _, stderr, code := run(t, "export", "--run", out, "--format", "merged", "--out", merged); code != 0 {
		t.Fatalf("export: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := run(t, "export", "--run", out, "--format", "merged", "--out", merged); code != 2 || !strings.Contains(stderr, "already holds an export") {
		t.Errorf("second export: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := run(t, "export", "--run", out, "--format", "merged", "--out", merged, "--overwrite"); code != 0 {
		t.Errorf("--overwrite: exit %d\n%s", code, stderr)
	}
}

// vitFixture makes, in a new temporary folder (returned), a 3-class tiny ViT and 12 images of its data.
func vitFixture(t *testing.T) (tmp, model, data string) {
	t.Helper()
	tmp = t.TempDir()
	model = filepath.Join(tmp, "vit")
	if _, stderr, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", model); code != 0 {
		t.Fatalf("init: exit %d\n%s", code, stderr)
	}
	data = filepath.Join(tmp, "train.safetensors")
	writeImageData(t, data, 12)
	return tmp, model, data
}

// TestTrainPeakUnavailable forces the Go backend's step peak to be unavailable (a compute version the executor
// model was not written for): training goes on, the progress lines say "peak unavailable (<reason>)" instead of
// "peak 0 B", and metrics.jsonl keeps peak_bytes 0 with the reason in peak_method.
func TestTrainPeakUnavailable(t *testing.T) {
	restore := memory.SetComputeVersionForTest("v0.1.99")
	defer restore()
	tmp := t.TempDir()
	model := filepath.Join(tmp, "vit")
	if _, e, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", model); code != 0 {
		t.Fatal(e)
	}
	data := filepath.Join(tmp, "train.safetensors")
	writeImageData(t, data, 12)
	out := filepath.Join(tmp, "run")
	stdout, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", out, "--steps", "2",
		"--batch-size", "6", "--log-every", "1")
	if code != 0 {
		t.Fatalf("train exit %d: %s", code, stderr)
	}
	const reason = "modelled for compute v0.1.14, running v0.1.99"
	if all := stdout + stderr; !strings.Contains(all, "peak unavailable ("+reason+")") || strings.Contains(all, "peak 0 B") {
		t.Errorf("progress does not say the peak is unavailable:\n%s\n%s", stdout, stderr)
	}
	for _, l := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
		if l["peak_bytes"] != 0.0 || l["peak_method"] != "unavailable: "+reason {
			t.Errorf("metrics line %v", l)
		}
	}
}
