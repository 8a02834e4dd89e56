package cli_test

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/safetensors"
)

// treeSignature describes what is at path: every file under it with its size and SHA-256, sorted ("" when
// nothing is there), so that a command can be checked to have written, changed or removed nothing.
func treeSignature(t *testing.T, path string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(path, p)
		if d.Name() == finetune.LockFile {
			return nil // rewritten (the holder's process id) by any run that takes the folder
		}
		if d.IsDir() {
			lines = append(lines, rel+"/")
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("%s %d %x", rel, len(b), sha256.Sum256(b)))
		return nil
	})
	if os.IsNotExist(err) {
		return ""
	} else if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// llamaVariant copies pretrained/llama-tiny (config, weights, tokenizer) to dir with edit applied to its
// config.json fields.
func llamaVariant(t *testing.T, dir string, edit func(cfg map[string]any)) string {
	t.Helper()
	src := filepath.Join("..", "pretrained", "llama-tiny")
	os.MkdirAll(dir, 0o755)
	for _, name := range []string{"model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	raw, _ := os.ReadFile(filepath.Join(src, "config.json"))
	cfg := map[string]any{}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	out, _ := json.MarshalIndent(cfg, "", "  ")
	os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644)
	return dir
}

// poison rewrites the safetensors file at path with value at flat position at of tensor name, every tensor
// stored as dtype (F32, F16, BF16).
func poison(t *testing.T, path, name string, at int, value float32, dtype safetensors.DType) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]safetensors.Entry{}
	found := false
	for _, n := range f.Names() {
		v, err := f.TensorAs(n, dtypes.Float32)
		if err != nil {
			t.Fatal(err)
		}
		if n == name {
			vals := tensors.MustCopyFlatData[float32](v)
			vals[at] = value
			v, found = tensors.FromFlatDataAndDimensions(vals, v.Shape().Dimensions...), true
		}
		if entries[n], err = safetensors.FromTensor(v, dtype); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if !found {
		t.Fatalf("%s has no tensor %q", path, name)
	}
	if err := safetensors.Write(path, entries, nil); err != nil {
		t.Fatal(err)
	}
}

// TestBadInputSweepConfigs runs, through the CLI, the bad inputs of issue 28 that come from the Hugging Face world
// and from config files: config.json fields transformers reads in other forms or memfit cannot honour, weights
// that are not finite, YAML config files, memory budgets, checkpoints without checksums, a resume with nothing to
// resume. Each must end with a non-zero exit and one line "finetune: ..." naming the cause, with no panic, stack or
// Go type in the output, and must leave the watched paths (the output folder, the inputs) as they were. The rows
// are in docs/reliability.md, "Issue 28".
func TestBadInputSweepConfigs(t *testing.T) {
	tmp := t.TempDir()
	text := filepath.Join(tmp, "story.txt")
	os.WriteFile(text, []byte(strings.Repeat("Once upon a time there was a model that read a story. ", 60)), 0o644)
	out := func(name string) string { return filepath.Join(tmp, "runs", name) }
	mmlu := filepath.Join("..", "..", "shared", "data", "mmlu")
	inputs := filepath.Join(tmp, "inputs.json")
	os.WriteFile(inputs, []byte(`{"input_ids": [[1, 2, 3]]}`), 0o644)

	variant := func(name string, edit func(map[string]any)) string {
		return llamaVariant(t, filepath.Join(tmp, name), edit)
	}
	eosOut := variant("eos-out", func(c map[string]any) { c["eos_token_id"] = []int{4094, 5000} })
	eosText := variant("eos-text", func(c map[string]any) { c["eos_token_id"] = "</s>" })
	bosOut := variant("bos-out", func(c map[string]any) { c["bos_token_id"] = 4096 })
	padOut := variant("pad-out", func(c map[string]any) { c["pad_token_id"] = -5 })
	yarn := variant("yarn", func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 4.0} })
	dynamic := variant("dynamic", func(c map[string]any) { c["rope_scaling"] = map[string]any{"type": "dynamic", "factor": 2.0} })
	ropeText := variant("rope-text", func(c map[string]any) { c["rope_scaling"] = "llama3" })
	ropeV5 := variant("rope-v5", func(c map[string]any) {
		c["rope_parameters"] = map[string]any{"rope_type": "longrope", "rope_theta": 10000.0}
	})
	noPositions := variant("mpe0", func(c map[string]any) { c["max_position_embeddings"] = 0 })
	heads := variant("heads", func(c map[string]any) {
		delete(c, "head_dim")
		c["num_attention_heads"] = 3
		c["num_key_value_heads"] = 3
	})
	layersText := variant("layers-text", func(c map[string]any) { c["num_hidden_layers"] = "four" })
	deep := variant("deep", func(c map[string]any) { c["num_hidden_layers"] = 512 })

	// Weights that are not finite: a model (float32, and bfloat16), an adapter, a ViT.
	nanModel := variant("nan", func(map[string]any) {})
	poison(t, filepath.Join(nanModel, "model.safetensors"), "model.layers.1.self_attn.v_proj.weight", 129, float32(math.NaN()), safetensors.F32)
	infBF16 := variant("inf-bf16", func(map[string]any) {})
	poison(t, filepath.Join(infBF16, "model.safetensors"), "model.norm.weight", 3, float32(math.Inf(-1)), safetensors.BF16)
	nanAdapter := filepath.Join(tmp, "nan-adapter")
	os.MkdirAll(nanAdapter, 0o755)
	for _, name := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		b, _ := os.ReadFile(filepath.Join("..", "pretrained", "llama-tiny-alpaca", name))
		os.WriteFile(filepath.Join(nanAdapter, name), b, 0o644)
	}
	poison(t, filepath.Join(nanAdapter, "adapter_model.safetensors"), "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight", 5, float32(math.NaN()), safetensors.F32)
	vit := filepath.Join(tmp, "vit")
	run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", vit)
	images := filepath.Join(tmp, "images.safetensors")
	writeImageData(t, images, 12)
	vitNaN := filepath.Join(tmp, "vit-nan")
	os.MkdirAll(vitNaN, 0o755)
	for _, name := range []string{"config.json", "model.safetensors"} {
		b, _ := os.ReadFile(filepath.Join(vit, name))
		os.WriteFile(filepath.Join(vitNaN, name), b, 0o644)
	}
	poison(t, filepath.Join(vitNaN, "model.safetensors"), "vit.encoder.layer.0.output.dense.weight", 0, float32(math.Inf(1)), safetensors.F32)

	// A run whose base model's weights later became NaN (export reloads the base), a run with its checkpoint's
	// checksums deleted, and a run that stopped before its first checkpoint.
	good := variant("good", func(map[string]any) {})
	base := filepath.Join(tmp, "base")
	os.MkdirAll(base, 0o755)
	for _, name := range []string{"config.json", "model.safetensors"} {
		b, _ := os.ReadFile(filepath.Join(vit, name))
		os.WriteFile(filepath.Join(base, name), b, 0o644)
	}
	trained := out("trained")
	if _, errOut, code := run(t, "train", "--model", base, "--data", images, "--out", trained, "--steps", "2", "--batch-size", "4",
		"--train-modules", "classifier"); code != 0 {
		t.Fatalf("train: exit %d: %s", code, errOut)
	}
	noSums := out("no-checksums")
	if err := os.CopyFS(noSums, os.DirFS(trained)); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(noSums, "checkpoint-2", finetune.StateFile)
	raw, _ := os.ReadFile(state)
	var fields map[string]any
	json.Unmarshal(raw, &fields)
	delete(fields, "checksums")
	raw, _ = json.Marshal(fields)
	os.WriteFile(state, raw, 0o644)
	early := out("early")
	os.MkdirAll(early, 0o755)
	for _, name := range []string{finetune.RunFile, finetune.MetricsFile} {
		b, _ := os.ReadFile(filepath.Join(trained, name))
		os.WriteFile(filepath.Join(early, name), b, 0o644)
	}
	// A copy of the run whose run.yaml names a copy of the base model, poisoned after training (export reloads
	// the base model).
	poisonedBase := out("poisoned-base")
	if err := os.CopyFS(poisonedBase, os.DirFS(trained)); err != nil {
		t.Fatal(err)
	}
	base2 := filepath.Join(tmp, "base2")
	if err := os.CopyFS(base2, os.DirFS(base)); err != nil {
		t.Fatal(err)
	}
	absBase, _ := filepath.Abs(base)
	absBase2, _ := filepath.Abs(base2)
	runYAML, _ := os.ReadFile(filepath.Join(poisonedBase, finetune.RunFile))
	os.WriteFile(filepath.Join(poisonedBase, finetune.RunFile), []byte(strings.ReplaceAll(string(runYAML), absBase, absBase2)), 0o644)
	poison(t, filepath.Join(base2, "model.safetensors"), "vit.encoder.layer.0.output.dense.weight", 7, float32(math.NaN()), safetensors.F32)

	// Config files.
	yamlFile := func(name, body string) string {
		p := filepath.Join(tmp, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	dupKey := yamlFile("dup.yaml", "steps: 5\nlr: 0.001\nsteps: 6\n")
	typeErr := yamlFile("type.yaml", "lr: 0.001\nsteps: ten\n")
	twoDocs := yamlFile("docs.yaml", "steps: 5\n---\nsteps: 6\n")
	dashKey := yamlFile("dash.yaml", "lora-r: 4\n")
	quoted := yamlFile("quoted.yaml", "lr: \"1e-3\"\n")
	blockPlan := yamlFile("plan.yaml", "block_plan: grad-ckpt*2\n")
	listConfig := yamlFile("list.yaml", "- steps: 5\n")

	train := func(model, name string, extra ...string) []string {
		return append([]string{"train", "--model", model, "--data", text, "--out", out(name), "--steps", "1", "--seq-len", "32", "--batch-size", "2"}, extra...)
	}
	trainViT := func(model, name string, extra ...string) []string {
		return append([]string{"train", "--model", model, "--data", images, "--out", out(name), "--steps", "1", "--batch-size", "4"}, extra...)
	}
	gen := func(model string, extra ...string) []string {
		return append([]string{"generate", "--model", model, "--prompt", "Once upon a time", "--max-new-tokens", "4"}, extra...)
	}
	cases := []struct {
		args  []string
		want  string
		watch []string // paths that must be as they were (an output that must not appear, an input)
	}{
		// config.json read as transformers reads it; what memfit cannot honour refused by name.
		{args: train(eosOut, "a1"), want: `field "eos_token_id" holds 5000, outside the vocabulary [0, 4096) (vocab_size)`, watch: []string{out("a1")}},
		{args: gen(eosOut), want: `field "eos_token_id" holds 5000`},
		{args: []string{"memory", "--model", eosOut, "--seq-len", "16", "--batch-size", "1"}, want: `field "eos_token_id" holds 5000`},
		{args: []string{"eval", "mmlu", "--model", eosOut, "--data", mmlu, "--subjects", "anatomy", "--limit", "1"}, want: `field "eos_token_id" holds 5000`},
		{args: []string{"logits", "--model", eosOut, "--inputs", inputs}, want: `field "eos_token_id" holds 5000`},
		{args: gen(eosText), want: `field "eos_token_id" is "</s>": want a token id (a whole number) or a list of token ids`},
		{args: gen(bosOut), want: `field "bos_token_id" is 4096, outside the vocabulary [0, 4096)`},
		{args: gen(padOut), want: `field "pad_token_id" is -5, outside the vocabulary [0, 4096) (vocab_size): give an id inside it, or -1 or null for none`},
		{args: train(yarn, "a2"), want: `rope_scaling type "yarn" is not supported by memfit: supported are default, linear, llama3 and longrope`, watch: []string{out("a2")}},
		{args: []string{"memory", "--model", dynamic, "--seq-len", "16", "--batch-size", "1"}, want: `rope_scaling type "dynamic" is not supported by memfit`},
		{args: gen(ropeV5), want: `field "rope_parameters": "short_factor" is missing (rope_type "longrope" needs it)`},
		{args: gen(ropeText), want: `field "rope_scaling" is "llama3": want an object such as {"rope_type": "llama3", "factor": 8, ...}, or null`},
		{args: gen(noPositions), want: `field "max_position_embeddings" must be positive, got 0`},
		{args: train(heads, "a3"), want: `field "hidden_size" (128) is not a multiple of "num_attention_heads" (3), and no head_dim is given`, watch: []string{out("a3")}},
		{args: []string{"memory", "--model", layersText}, want: `field "num_hidden_layers" is "four": want a whole number`},
		// Weights that are not finite, refused at load by every command that reads them.
		{args: train(nanModel, "b1"), want: `tensor "model.layers.1.self_attn.v_proj.weight" holds NaN at [1 1], its first non-finite value`, watch: []string{out("b1"), nanModel}},
		{args: gen(nanModel), want: `tensor "model.layers.1.self_attn.v_proj.weight" holds NaN at [1 1]`},
		{args: []string{"eval", "mmlu", "--model", nanModel, "--data", mmlu, "--subjects", "anatomy", "--limit", "1", "--out", filepath.Join(tmp, "mmlu.json")},
			want: `holds NaN at [1 1]`, watch: []string{filepath.Join(tmp, "mmlu.json")}},
		{args: []string{"logits", "--model", nanModel, "--inputs", inputs}, want: `holds NaN at [1 1]`},
		{args: gen(infBF16), want: `tensor "model.norm.weight" holds -Inf at [3]`},
		{args: gen(good, "--adapter", nanAdapter), want: `adapter_model.safetensors: tensor "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight" holds NaN at [0 5]`},
		{args: train(good, "b2", "--init-adapter", nanAdapter, "--lora-r", "16", "--lora-alpha", "32"), want: `lora_A.weight" holds NaN at [0 5]`, watch: []string{out("b2"), nanAdapter}},
		{args: trainViT(vitNaN, "b3"), want: `tensor "vit.encoder.layer.0.output.dense.weight" holds +Inf at [0 0]`, watch: []string{out("b3")}},
		{args: []string{"export", "--run", poisonedBase, "--format", "merged", "--out", filepath.Join(tmp, "merged")},
			want: `tensor "vit.encoder.layer.0.output.dense.weight" holds NaN at [0 7]`, watch: []string{filepath.Join(tmp, "merged"), poisonedBase}},
		// Config files.
		{args: train(good, "c1", "--config", dupKey), want: `dup.yaml:3: key "steps" is given twice (first on line 1): keep one`, watch: []string{out("c1")}},
		{args: train(good, "c2", "--config", typeErr), want: `type.yaml:2: steps: "ten" is not a whole number`, watch: []string{out("c2")}},
		{args: train(good, "c3", "--config", twoDocs), want: `docs.yaml:3: a second YAML document (after ---): a config file holds one`, watch: []string{out("c3")}},
		{args: []string{"memory", "--model", "llama:tiny", "--config", dashKey}, want: `dash.yaml:1: unknown key "lora-r": keys use underscores (lora_r)`},
		{args: train(good, "c4", "--config", quoted, "--dry-run"), want: `quoted.yaml:1: lr: "1e-3" is not a number (it is in quotes: write it without them)`},
		{args: train(good, "c5", "--config", listConfig), want: `list.yaml:1: the config is a list, not a mapping of settings`, watch: []string{out("c5")}},
		// Memory budgets, with the whole config, before anything is loaded or timed.
		{args: train(good, "d1", "--budget", "0"), want: `--budget 0: a memory budget must be positive`, watch: []string{out("d1")}},
		{args: train(good, "d2", "--budget=-2GiB"), want: `--budget -2GiB: a memory budget must be positive`, watch: []string{out("d2")}},
		{args: train(good, "d3", "--budget", "1e30"), want: `--budget 1e30 is 1e+30 bytes, more than memfit plans for (at most 1PiB)`, watch: []string{out("d3")}},
		{args: train(good, "d4", "--budget", "0.5"), want: `--budget 0.5 is 0.5 bytes, less than 1KiB, smaller than any training step`, watch: []string{out("d4")}},
		{args: train(good, "d5", "--budget", "1GiB", "--budget-margin", "1.5"), want: `--budget-margin 1.5: give the fraction of the budget kept free, in [0, 1)`, watch: []string{out("d5")}},
		{args: train(good, "d6", "--budget", "1GiB", "--block-plan", "grad-ckpt*4"), want: `leave --block-plan (grad-ckpt*4) off`, watch: []string{out("d6")}},
		{args: train(good, "d7", "--budget", "1GiB", "--config", blockPlan), want: `leave --block-plan (grad-ckpt*2) off (a flag, or its key in --config)`, watch: []string{out("d7")}},
		{args: []string{"memory", "--model", "llama:tiny", "--budget", "16MiB", "--plan", "--budget-margin", "-0.1"}, want: `--budget-margin -0.1: give the fraction`},
		{args: []string{"memory", "--model", "llama:tiny", "--budget", "lots", "--max-seq-len", "64"}, want: `--budget "lots" is not a size`},
		{args: []string{"memory", "--model", "llama:tiny", "--budget", "16MiB", "--plan", "--for-backend", "tpu"}, want: `--for-backend "tpu": the cost model knows go, xla:cuda, xla:cuda:h200 (a device profile each: docs/autopilot.md); give one of them`},
		{args: []string{"memory", "--model", "llama:tiny", "--for-backend", "xla:cuda"}, want: `--for-backend is a setting of the memory autopilot: it goes with --budget SIZE --plan`},
		{args: train(good, "d8", "--calibrate=false"), want: `--budget-batch, --budget-margin and --calibrate go with --budget`, watch: []string{out("d8")}},
		// Depth: gradient checkpointing of more blocks than a step can be built for in seconds.
		{args: []string{"memory", "--model", deep, "--seq-len", "16", "--batch-size", "1", "--compile-time"}, want: `variant grad-ckpt: gradient checkpointing of 512 blocks: memfit checkpoints at most 256`},
		{args: []string{"memory", "--model", deep, "--seq-len", "16", "--batch-size", "1", "--variants", "plain,grad-ckpt"}, want: `gradient checkpointing of 512 blocks`},
		// Checkpoints.
		{args: []string{"train", "--out", noSums, "--resume", "--steps", "3"}, want: `trainer_state.json has no checksum of trainable.safetensors (memfit writes one with every checkpoint), so its bytes cannot be checked`, watch: []string{noSums}},
		{args: []string{"export", "--run", noSums, "--format", "peft", "--out", filepath.Join(tmp, "peft")}, want: `has no checksum of trainable.safetensors`, watch: []string{noSums, filepath.Join(tmp, "peft")}},
		{args: []string{"train", "--out", early, "--resume"}, want: `holds a run that stopped before its first checkpoint (metrics.jsonl, run.yaml): there is nothing to resume: run the same train command without --resume and with --overwrite to start it again`, watch: []string{early}},
	}
	for _, c := range cases {
		before := make([]string, len(c.watch))
		for i, p := range c.watch {
			before[i] = treeSignature(t, p)
		}
		_, stderr, code := run(t, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		t.Logf("%s -> exit %d: %s", c.args[0], code, last)
		if code == 0 || len(lines) != 1 || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, c.want) {
			t.Errorf("%v: exit %d, %d line(s), last %q; want a non-zero exit and one line naming %q", c.args, code, len(lines), last, c.want)
		}
		for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:", "Go value", "Go struct", "of type "} {
			if strings.Contains(stderr, bad) {
				t.Errorf("%v: %q in the output:\n%s", c.args, bad, stderr)
			}
		}
		for i, p := range c.watch {
			if after := treeSignature(t, p); after != before[i] {
				t.Errorf("%v: %s changed:\nbefore:\n%s\nafter:\n%s", c.args, p, before[i], after)
			}
		}
	}
	t.Logf("%d bad commands, each refused with one line", len(cases))

	// What is honoured, not refused: a 512-layer model's step plans in seconds (it took minutes), and the
	// config.json forms transformers reads (TestLlama3StyleConfig trains, generates and exports one).
	if _, stderr, code := run(t, "memory", "--model", deep, "--seq-len", "16", "--batch-size", "1", "--variants", "plain,approx-act+ms-norm"); code != 0 {
		t.Errorf("memory of a 512-layer model: exit %d: %s", code, stderr)
	}
}
