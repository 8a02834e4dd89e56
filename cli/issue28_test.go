package cli_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"
	"sigs.k8s.io/yaml"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/examples/dora"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/safetensors"
)

// Helpers and functional tests of issue 28 (outputs, adapters and exports); the bad-input sweep is in
// badinput28_outputs_test.go.

// copyTree copies the folder from to to (files only, links followed).
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// storyText writes a short English text file for causal-LM training and returns its path.
func storyText(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "story.txt")
	if err := os.WriteFile(p, []byte(strings.Repeat("Once upon a time there was a small model that learned to tell stories. ", 40)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// mustRun runs the CLI and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, code := run(t, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, stderr)
	}
	return stdout
}

// tensorsOf reads every tensor of a safetensors file as float32 values by name.
func tensorsOf(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float32{}
	for _, n := range f.Names() {
		v, err := f.TensorAs(n, dtypes.Float32)
		if err != nil {
			t.Fatal(err)
		}
		if err := tensors.ConstFlatData[float32](v, func(flat []float32) { out[n] = slices.Clone(flat) }); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestInitAdapterRunIsSelfContained: a LoRA-FA run started from --init-adapter DIR takes r, alpha and its 28
// targets from the adapter (run.yaml says so), keeps a copy of DIR in its checkpoints, and resumes and exports
// after DIR is deleted; the exported frozen A is the init adapter's, bit for bit. A --lora-targets or --lora-r
// that contradicts the adapter is refused in one line.
func TestInitAdapterRunIsSelfContained(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join("..", "pretrained", "llama-tiny")
	initDir := filepath.Join(tmp, "init")
	copyTree(t, filepath.Join("..", "pretrained", "llama-tiny-alpaca"), initDir)
	initA := tensorsOf(t, filepath.Join(initDir, "adapter_model.safetensors"))
	data := storyText(t, tmp)
	common := []string{"--model", model, "--data", data, "--seq-len", "32", "--batch-size", "2", "--log-every", "1"}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--lora-targets", "q,v"}, "lora_targets [q v] selects 8 layers but init_adapter"},
		{[]string{"--lora-r", "8"}, "lora_r 8 conflicts with init_adapter"},
		{[]string{"--lora-alpha", "16"}, "lora_alpha 16 conflicts with init_adapter"},
	} {
		args := append(append([]string{"train", "--out", filepath.Join(tmp, "refused"), "--init-adapter", initDir, "--steps", "1"}, common...), c.args...)
		_, stderr, code := run(t, args...)
		if code != 2 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line with %q", c.args, code, stderr, c.want)
		}
	}

	out := filepath.Join(tmp, "run")
	mustRun(t, append([]string{"train", "--out", out, "--init-adapter", initDir, "--method", "lora-fa", "--steps", "2",
		"--checkpoint-every", "1", "--lr", "1e-2"}, common...)...)
	b, err := os.ReadFile(filepath.Join(out, "run.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Config struct {
			LoRARank  int      `json:"lora_r"`
			LoRAAlpha float64  `json:"lora_alpha"`
			Targets   []string `json:"lora_targets"`
		} `json:"config"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Config.LoRARank != 16 || spec.Config.LoRAAlpha != 32 || len(spec.Config.Targets) != 28 || spec.Config.Targets[0] != "model.layers.0.mlp.down_proj" {
		t.Errorf("run.yaml: r %d, alpha %g, %d targets %v; want the adapter's 16, 32 and 28 module paths",
			spec.Config.LoRARank, spec.Config.LoRAAlpha, len(spec.Config.Targets), spec.Config.Targets)
	}
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		kept, err1 := os.ReadFile(filepath.Join(out, "checkpoint-2", "init-adapter", f))
		orig, err2 := os.ReadFile(filepath.Join(initDir, f))
		if err1 != nil || err2 != nil || !bytes.Equal(kept, orig) {
			t.Errorf("checkpoint-2/init-adapter/%s is not a copy of the init adapter's (%v, %v)", f, err1, err2)
		}
	}
	if err := os.RemoveAll(initDir); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "train", "--out", out, "--resume", "--steps", "4")
	if _, err := os.Stat(filepath.Join(out, "checkpoint-4", "init-adapter", "adapter_model.safetensors")); err != nil {
		t.Errorf("the resumed run's checkpoint lacks the init adapter: %v", err)
	}
	peft := filepath.Join(tmp, "peft")
	mustRun(t, "export", "--run", out, "--format", "peft", "--out", peft)
	mustRun(t, "export", "--run", out, "--format", "merged", "--out", filepath.Join(tmp, "merged"))
	got := tensorsOf(t, filepath.Join(peft, "adapter_model.safetensors"))
	moved := 0
	for name, v := range initA {
		switch {
		case strings.HasSuffix(name, "lora_A.weight") && !slices.Equal(got[name], v):
			t.Errorf("%s: the frozen A is not the init adapter's", name)
		case strings.HasSuffix(name, "lora_B.weight") && !slices.Equal(got[name], v):
			moved++
		}
	}
	if moved == 0 {
		t.Error("training moved no lora_B")
	}
}

// TestMergedExportIsAModelFolder: a LoRA run on pretrained/llama-tiny exported merged is a complete Hugging Face
// folder (tokenizer files, generation_config.json, config.json, weights): `generate --model MERGED` gives the
// same greedy tokens as `generate --model BASE --adapter ADAPTER`, `eval mmlu` takes it, and a plain-torch LLaMA
// (bench/pytorch/merged_logits.py, Debian's python3-torch; skipped without it) reading only its config.json
// and model.safetensors computes memfit's logits to 1e-4.
func TestMergedExportIsAModelFolder(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join("..", "pretrained", "llama-tiny")
	out := filepath.Join(tmp, "run")
	mustRun(t, "train", "--model", model, "--data", storyText(t, tmp), "--seq-len", "32", "--batch-size", "2",
		"--steps", "3", "--lora-targets", "all-linear", "--lr", "2e-2", "--out", out)
	merged := filepath.Join(tmp, "merged")
	mustRun(t, "export", "--run", out, "--format", "merged", "--out", merged)
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		if _, err := os.Stat(filepath.Join(merged, f)); err != nil {
			t.Errorf("the merged folder lacks %s", f)
		}
	}
	var gen map[string]any
	if b, err := os.ReadFile(filepath.Join(merged, "generation_config.json")); err != nil || json.Unmarshal(b, &gen) != nil || gen["eos_token_id"] == nil {
		t.Errorf("generation_config.json %v: %v", gen, err)
	}
	prompt := []string{"--prompt", "Once upon a time", "--max-new-tokens", "16", "--ignore-eos", "--json"}
	fromMerged := readGenerated(t, mustRun(t, append([]string{"generate", "--model", merged}, prompt...)...))
	withAdapter := readGenerated(t, mustRun(t, append([]string{"generate", "--model", model, "--adapter", filepath.Join(out, "adapter")}, prompt...)...))
	base := readGenerated(t, mustRun(t, append([]string{"generate", "--model", model}, prompt...)...))
	if len(fromMerged) != 1 || fromMerged[0] != withAdapter[0] {
		t.Errorf("merged %+v, base + adapter %+v: want the same greedy tokens", fromMerged, withAdapter)
	}
	if fromMerged[0].Completion == base[0].Completion {
		t.Errorf("the merged model generates what the base model does: %+v", base)
	}
	mustRun(t, "eval", "mmlu", "--model", merged, "--data", filepath.Join("..", "..", "shared", "data", "mmlu"),
		"--subjects", "anatomy", "--limit", "1", "--out", filepath.Join(tmp, "mmlu.json"))

	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch, numpy").Run(); err != nil {
		t.Skipf("no torch in %s (Debian's python3-torch): %v", py, err)
	}
	inputs := filepath.Join(tmp, "inputs.json")
	os.WriteFile(inputs, []byte(`{"input_ids": [[1, 312, 45, 1907, 23, 88, 640, 7], [1, 5, 99, 2048, 301, 17, 4, 1200]]}`), 0o644)
	var ours, theirs struct {
		Logits [][][]float64 `json:"logits"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, "logits", "--model", merged, "--inputs", inputs)), &ours); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join("..", "bench", "pytorch", "merged_logits.py"), "--model", merged, "--inputs", inputs)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("merged_logits.py: %v: %s", err, stderr.String())
	}
	if err := json.Unmarshal(stdout, &theirs); err != nil {
		t.Fatalf("merged_logits.py printed %q: %v", stdout, err)
	}
	worst, n := 0.0, 0
	for b := range ours.Logits {
		for i := range ours.Logits[b] {
			for j, x := range ours.Logits[b][i] {
				worst = max(worst, abs64(x-theirs.Logits[b][i][j]))
				n++
			}
		}
	}
	if n == 0 || n != 2*8*len(theirs.Logits[0][0]) {
		t.Fatalf("compared %d logits", n)
	}
	if worst > 1e-4 {
		t.Errorf("memfit's logits of the merged model differ from plain torch's by up to %g (want <= 1e-4)", worst)
	}
	t.Logf("%d logits, largest difference from plain torch %.2g", n, worst)
}

func abs64(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// editAdapter copies the adapter folder from to to with its config's keys replaced by set (nil values delete
// them) and its tensors passed through edit (which may change, add or delete them).
func editAdapter(t *testing.T, from, to string, set map[string]any, edit func(map[string][]float32, map[string][]int)) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	b, err := os.ReadFile(filepath.Join(from, "adapter_config.json"))
	if err != nil || json.Unmarshal(b, &c) != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	b, _ = json.MarshalIndent(c, "", "  ")
	if err := os.WriteFile(filepath.Join(to, "adapter_config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	values := tensorsOf(t, filepath.Join(from, "adapter_model.safetensors"))
	f, err := safetensors.Open(filepath.Join(from, "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	dims := map[string][]int{}
	for _, n := range f.Names() {
		info, _ := f.Info(n)
		dims[n] = info.Shape
	}
	f.Close()
	if edit != nil {
		edit(values, dims)
	}
	out := map[string]*tensors.Tensor{}
	for n, v := range values {
		out[n] = tensors.FromFlatDataAndDimensions(v, dims[n]...)
	}
	if err := safetensors.WriteTensors(filepath.Join(to, "adapter_model.safetensors"), out, "", nil); err != nil {
		t.Fatal(err)
	}
}

// TestPEFTConfigFieldsHonoured: the per-layer and layer-choice fields of a PEFT LoRA config change what the
// adapter computes exactly as PEFT would (each checked through `finetune logits` against an equivalent adapter
// without the field): alpha_pattern, rank_pattern, layers_to_transform with layers_pattern, a regular-expression
// target_modules, modules_to_save (the saved module's weights are loaded).
func TestPEFTConfigFieldsHonoured(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join("..", "pretrained", "llama-tiny")
	alpaca := filepath.Join("..", "pretrained", "llama-tiny-alpaca")
	inputs := filepath.Join(tmp, "inputs.json")
	os.WriteFile(inputs, []byte(`{"input_ids": [[1, 312, 45, 1907, 23, 88]]}`), 0o644)
	logits := func(adapterDir string) string {
		t.Helper()
		return mustRun(t, "logits", "--model", model, "--adapter", adapterDir, "--inputs", inputs)
	}
	closeTo := func(a, b string) bool {
		var x, y struct{ Logits [][][]float64 }
		if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
			return false
		}
		for i := range x.Logits[0] {
			for j := range x.Logits[0][i] {
				if abs64(x.Logits[0][i][j]-y.Logits[0][i][j]) > 1e-4 {
					return false
				}
			}
		}
		return len(x.Logits[0]) > 0
	}
	plain := logits(alpaca)
	isV := func(n string) bool { return strings.Contains(n, "v_proj") }
	scaleB := func(pick func(string) bool, f float32) func(map[string][]float32, map[string][]int) {
		return func(v map[string][]float32, _ map[string][]int) {
			for n := range v {
				if pick(n) && strings.HasSuffix(n, "lora_B.weight") {
					for i := range v[n] {
						v[n][i] *= f
					}
				}
			}
		}
	}
	cases := []struct {
		name          string
		set           map[string]any
		edit          func(map[string][]float32, map[string][]int)
		same          map[string]any // the equivalent adapter, from the shipped one
		sameEdit      func(map[string][]float32, map[string][]int)
		differsFromIt bool
	}{
		{name: "alpha_pattern", set: map[string]any{"alpha_pattern": map[string]any{"v_proj": 64}},
			sameEdit: scaleB(isV, 2), differsFromIt: true},
		{name: "alpha_pattern, first match wins", set: map[string]any{"alpha_pattern": map[string]any{"layers.0.self_attn.v_proj": 96, "v_proj": 64}},
			sameEdit: func(v map[string][]float32, d map[string][]int) {
				scaleB(func(n string) bool { return isV(n) && !strings.Contains(n, "layers.0.") }, 2)(v, d)
				scaleB(func(n string) bool { return strings.Contains(n, "layers.0.self_attn.v_proj") }, 3)(v, d)
			}, differsFromIt: true},
		{name: "rank_pattern", set: map[string]any{"rank_pattern": map[string]any{"v_proj": 8}, "alpha_pattern": map[string]any{"v_proj": 16}},
			edit: func(v map[string][]float32, d map[string][]int) { // keep the first 8 ranks of v_proj
				for n := range v {
					if !isV(n) {
						continue
					}
					if strings.HasSuffix(n, "lora_A.weight") {
						v[n], d[n] = v[n][:8*d[n][1]], []int{8, d[n][1]}
					} else if strings.HasSuffix(n, "lora_B.weight") {
						out, r := d[n][0], d[n][1]
						b := make([]float32, 0, out*8)
						for o := 0; o < out; o++ {
							b = append(b, v[n][o*r:o*r+8]...)
						}
						v[n], d[n] = b, []int{out, 8}
					}
				}
			},
			sameEdit: func(v map[string][]float32, d map[string][]int) { // ranks 8-15 of v_proj zero
				for n := range v {
					if isV(n) && strings.HasSuffix(n, "lora_B.weight") {
						out, r := d[n][0], d[n][1]
						for o := 0; o < out; o++ {
							clear(v[n][o*r+8 : o*r+r])
						}
					}
				}
			}, differsFromIt: true},
		{name: "layers_to_transform", set: map[string]any{"target_modules": []any{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
			"layers_to_transform": []any{0}, "layers_pattern": "layers"},
			edit: func(v map[string][]float32, _ map[string][]int) {
				for n := range v {
					if !strings.Contains(n, "layers.0.") {
						delete(v, n)
					}
				}
			},
			sameEdit: scaleB(func(n string) bool { return !strings.Contains(n, "layers.0.") }, 0), differsFromIt: true},
		{name: "target_modules as a regular expression", set: map[string]any{"target_modules": `model\.layers\.\d+\.(self_attn|mlp)\.[a-z]+_proj`}},
		{name: "modules_to_save", set: map[string]any{"modules_to_save": []any{"norm"}},
			edit: func(v map[string][]float32, d map[string][]int) {
				w := make([]float32, 128)
				for i := range w {
					w[i] = 0.5 + float32(i%7)/10
				}
				v["base_model.model.model.norm.weight"], d["base_model.model.model.norm.weight"] = w, []int{128}
			}, differsFromIt: true},
	}
	for i, c := range cases {
		dir := filepath.Join(tmp, "a", strings.ReplaceAll(c.name, " ", "-"))
		editAdapter(t, alpaca, dir, c.set, c.edit)
		got := logits(dir)
		if eq := closeTo(got, plain); eq == c.differsFromIt {
			t.Errorf("%s: logits equal to the unmodified adapter's: %v, want %v", c.name, eq, !c.differsFromIt)
		}
		if c.name == "modules_to_save" {
			// The equivalent: the shipped adapter on a base model whose final norm has the saved weights.
			base := filepath.Join(tmp, "base-with-norm")
			copyTree(t, model, base)
			p := tensorsOf(t, filepath.Join(base, "model.safetensors"))
			p["model.norm.weight"] = tensorsOf(t, filepath.Join(dir, "adapter_model.safetensors"))["base_model.model.model.norm.weight"]
			f, _ := safetensors.Open(filepath.Join(model, "model.safetensors"))
			out := map[string]*tensors.Tensor{}
			for _, n := range f.Names() {
				info, _ := f.Info(n)
				out[n] = tensors.FromFlatDataAndDimensions(p[n], info.Shape...)
			}
			f.Close()
			if err := safetensors.WriteTensors(filepath.Join(base, "model.safetensors"), out, "", nil); err != nil {
				t.Fatal(err)
			}
			if want := mustRun(t, "logits", "--model", base, "--adapter", alpaca, "--inputs", inputs); !closeTo(got, want) {
				t.Errorf("%s: the adapter's norm weights were not loaded", c.name)
			}
			continue
		}
		want := plain
		if c.sameEdit != nil {
			same := filepath.Join(tmp, "same", strings.ReplaceAll(c.name, " ", "-"))
			editAdapter(t, alpaca, same, c.same, c.sameEdit)
			want = logits(same)
		}
		if !closeTo(got, want) {
			t.Errorf("case %d, %s: logits differ from the equivalent adapter's", i, c.name)
		}
	}
}

// TestDoRAAdapterThroughTheCLI: a PEFT DoRA adapter (peft_type LORA, use_dora true) made with examples/dora on
// pretrained/llama-tiny loads through `finetune logits --adapter` (the CLI registers the DoRA format) and gives
// the logits of its merged export.
func TestDoRAAdapterThroughTheCLI(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join("..", "pretrained", "llama-tiny")
	model, err := finetune.LoadModel(dir, finetune.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	newDoRA, err := dora.New(lora.Config{Rank: 4, Alpha: 8})
	if err != nil {
		t.Fatal(err)
	}
	set, err := adapter.NewSet(model.LinearLayers(), []string{"q", "v", "down"}, newDoRA, 3, finetune.BaseWeights(model))
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range set.Params { // a trained-looking adapter: B and the magnitude away from their start
		if strings.HasSuffix(name, lora.SuffixB) || strings.HasSuffix(name, dora.SuffixMagnitude) {
			vals := gtest.Rand(uint64(len(name)), v.Shape().Size(), 0.05)
			if strings.HasSuffix(name, dora.SuffixMagnitude) {
				tensors.ConstFlatData[float32](v, func(m []float32) {
					for i := range vals {
						vals[i] += m[i]
					}
				})
			}
			set.Params[name] = tensors.FromFlatDataAndDimensions(vals, v.Shape().Dimensions...)
		}
	}
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRATarget = finetune.MethodCustom, 0, nil
	tr, err := finetune.New(model, cfg, gtest.Backend(t), finetune.WithAdapters(set))
	if err != nil {
		t.Fatal(err)
	}
	peft, merged := filepath.Join(tmp, "dora"), filepath.Join(tmp, "merged")
	if err := tr.ExportAdapter(peft, dir); err != nil {
		t.Fatal(err)
	}
	if err := tr.ExportMergedFolder(merged, dir, ""); err != nil {
		t.Fatal(err)
	}
	inputs := filepath.Join(tmp, "inputs.json")
	os.WriteFile(inputs, []byte(`{"input_ids": [[1, 312, 45, 1907, 23, 88]]}`), 0o644)
	var a, m struct{ Logits [][][]float64 }
	json.Unmarshal([]byte(mustRun(t, "logits", "--model", dir, "--adapter", peft, "--inputs", inputs)), &a)
	json.Unmarshal([]byte(mustRun(t, "logits", "--model", merged, "--inputs", inputs)), &m)
	worst := 0.0
	for i := range a.Logits[0] {
		for j := range a.Logits[0][i] {
			worst = max(worst, abs64(a.Logits[0][i][j]-m.Logits[0][i][j]))
		}
	}
	if len(a.Logits) == 0 || worst > 1e-4 {
		t.Errorf("DoRA adapter through the CLI vs its merged export: largest difference %g", worst)
	}
	var b struct{ Logits [][][]float64 }
	json.Unmarshal([]byte(mustRun(t, "logits", "--model", dir, "--inputs", inputs)), &b)
	moved := 0.0
	for j := range b.Logits[0][5] {
		moved = max(moved, abs64(a.Logits[0][5][j]-b.Logits[0][5][j]))
	}
	if moved < 1e-3 {
		t.Errorf("the DoRA adapter changes the logits by only %g", moved)
	}
}
