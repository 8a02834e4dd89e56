package cli_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// snapshot returns the SHA-256 of every file under root, by path.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil // a dangling link
		}
		h := sha256.Sum256(b)
		out[p] = hex.EncodeToString(h[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBadInputSweepOutputs runs issue 28's bad commands through the CLI, in the style of TestBadInputSweep: every
// output path that would replace an input or an earlier output (without --overwrite), and every PEFT adapter
// whose config memfit does not honour, must end with a non-zero exit and one line "finetune: ..." naming the
// cause, with no panic text, and leave every file of the test's folder byte for byte as it was, with no new one.
// The count is reported in docs/reliability.md.
func TestBadInputSweepOutputs(t *testing.T) {
	tmp := t.TempDir()
	p := func(parts ...string) string { return filepath.Join(append([]string{tmp}, parts...)...) }
	model, alpaca := p("model"), p("adapter")
	copyTree(t, filepath.Join("..", "pretrained", "llama-tiny"), model)
	copyTree(t, filepath.Join("..", "pretrained", "llama-tiny-alpaca"), alpaca)
	shared := filepath.Join("..", "..", "shared", "data")
	for _, f := range []string{"dev/anatomy_dev.csv", "test/anatomy_test.csv"} {
		b, err := os.ReadFile(filepath.Join(shared, "mmlu", f))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Dir(p("mmlu", f)), 0o755)
		os.WriteFile(p("mmlu", f), b, 0o644)
	}
	mmlu := p("mmlu")
	glue := p("glue")
	copyTree(t, filepath.Join(shared, "glue", "SST-2"), p("glue", "SST-2"))
	preds := p("preds.txt")
	os.WriteFile(preds, []byte(strings.Repeat("1\n", 872)), 0o644)
	story := storyText(t, tmp)
	tok := p("tok")
	copyTree(t, model, tok)
	for _, f := range []string{"config.json", "model.safetensors"} {
		os.Remove(filepath.Join(tok, f))
	}
	sst2 := p("sst2")
	mustRun(t, "init", "--from", model, "--num-labels", "2", "--out", sst2)
	runDir := p("run")
	mustRun(t, "train", "--model", model, "--data", story, "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--out", runDir)
	earlier := p("earlier.json")
	os.WriteFile(earlier, []byte("{}\n"), 0o644)
	exported := p("exported")
	mustRun(t, "export", "--run", runDir, "--format", "peft", "--out", exported)
	// A folder whose model.safetensors is a hard link to the base model's, one whose config.json links to it.
	os.MkdirAll(p("hardlink"), 0o755)
	if err := os.Link(filepath.Join(model, "model.safetensors"), p("hardlink", "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(p("symlink"), 0o755)
	if err := os.Symlink(filepath.Join(model, "config.json"), p("symlink", "config.json")); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(model, "model.safetensors"), p("link.json"))
	// An init adapter inside the folder a run would write (its adapter/ subfolder), a config file named run.yaml.
	copyTree(t, alpaca, p("t1", "adapter"))
	os.MkdirAll(p("t2"), 0o755)
	os.WriteFile(p("t2", "run.yaml"), []byte("lr: 0.001\n"), 0o644)
	// Earlier results of the folder-writing bench and pretrain commands, and bench compare's inputs.
	for _, f := range []string{"cpu/cpu-compare.json", "autopilot/autopilot.json", "gen/generate.json", "cmp/memfit-a.json",
		"fashion/fashion-5to9-train-images.idx.gz", "vit/model.safetensors"} {
		os.MkdirAll(filepath.Dir(p(f)), 0o755)
		os.WriteFile(p(f), []byte("{}\n"), 0o644)
	}
	// PEFT adapters whose configs memfit must refuse, each naming the field.
	bad := func(name string, set map[string]any, edit func(map[string][]float32, map[string][]int)) string {
		dir := p("bad", name)
		editAdapter(t, alpaca, dir, set, edit)
		return dir
	}
	dora := bad("dora", map[string]any{"use_dora": true}, nil)
	inputs := p("inputs.json")
	os.WriteFile(inputs, []byte(`{"input_ids": [[1, 312, 45, 1907]]}`), 0o644)
	logits := func(adapterDir string) []string {
		return []string{"logits", "--model", model, "--adapter", adapterDir, "--inputs", inputs}
	}
	mmluOut := func(out string, extra ...string) []string {
		return append([]string{"eval", "mmlu", "--model", model, "--data", mmlu, "--subjects", "anatomy", "--limit", "1", "--out", out}, extra...)
	}
	trainArgs := func(extra ...string) []string {
		return append([]string{"train", "--model", model, "--data", story, "--seq-len", "32", "--batch-size", "2", "--steps", "1"}, extra...)
	}

	cases := []struct {
		args []string
		want string
	}{
		// Outputs over inputs: refused naming both, with or without --overwrite.
		{mmluOut(filepath.Join(model, "model.safetensors")), "is a file this command reads (--model"},
		{mmluOut(filepath.Join(model, "model.safetensors"), "--overwrite"), "is a file this command reads (--model"},
		{mmluOut(filepath.Join(model, "config.json"), "--overwrite"), "config.json is a file this command reads (--model"},
		{mmluOut(filepath.Join(alpaca, "adapter_config.json"), "--adapter", alpaca, "--overwrite"), "is a file this command reads (--adapter"},
		{mmluOut(filepath.Join(mmlu, "test", "anatomy_test.csv"), "--overwrite"), "is a file this command reads (--data"},
		{mmluOut(filepath.Join(tok, "tokenizer.json"), "--tokenizer", tok, "--overwrite"), "is a file this command reads (--tokenizer"},
		{mmluOut(p("link.json"), "--overwrite"), "which this command reads (--model"},
		{[]string{"eval", "glue", "--task", "sst2", "--data", glue, "--predictions", preds, "--out", preds, "--overwrite"}, "is a file this command reads (--predictions)"},
		{[]string{"eval", "glue", "--task", "sst2", "--data", glue, "--predictions", preds, "--out", p("glue", "SST-2", "dev.tsv")}, "is a file this command reads (--data"},
		{[]string{"eval", "glue", "--task", "sst2", "--data", glue, "--model", sst2, "--out", filepath.Join(sst2, "model.safetensors")}, "(--model"},
		{[]string{"export", "--run", runDir, "--format", "merged", "--out", p("hardlink"), "--overwrite"}, "which this command reads (the run's base model"},
		{[]string{"export", "--run", runDir, "--format", "merged", "--out", model, "--overwrite"}, "is the run's base model"},
		{[]string{"export", "--run", runDir, "--format", "peft", "--out", runDir}, "is a training output folder"},
		{[]string{"init", "--from", model, "--num-labels", "2", "--out", p("symlink"), "--overwrite"}, "which this command reads (--from"},
		{trainArgs("--init-adapter", p("t1", "adapter"), "--out", p("t1")), "is a file this command reads (--init-adapter"},
		{trainArgs("--config", p("t2", "run.yaml"), "--out", p("t2"), "--overwrite"), "is a file this command reads (--config)"},
		{[]string{"train", "--model", model, "--data", filepath.Join(runDir, "metrics.jsonl"), "--data-format", "text", "--out", runDir, "--overwrite"}, "metrics.jsonl is a file this command reads (--data)"},
		{[]string{"train", "--model", model, "--data", p("glue"), "--data-format", "glue", "--task", "sst2", "--out", p("glue", "run")}, "lies in --data"},
		{[]string{"bench", "grid", "--render", earlier, "--json", earlier, "--overwrite"}, "is a file this command reads (--render)"},
		{[]string{"bench", "step", "--model", model, "--json", filepath.Join(model, "config.json"), "--overwrite"}, "is a file this command reads (--model"},
		{[]string{"bench", "compare", p("cmp"), "--json", p("cmp", "memfit-a.json"), "--overwrite"}, "is a file this command reads (DIR"},
		{[]string{"pretrain", "tokenizer", "--text", filepath.Join(model, "tokenizer.json"), "--out", model, "--overwrite"}, "is a file this command reads (--text)"},
		// Earlier outputs: refused without --overwrite.
		{mmluOut(earlier), "already exists: pass --overwrite"},
		{[]string{"eval", "glue", "--task", "sst2", "--data", glue, "--predictions", preds, "--out", earlier}, "already exists: pass --overwrite"},
		{[]string{"bench", "memory", "--json", earlier}, "already exists: pass --overwrite"},
		{[]string{"bench", "grid", "--json", earlier}, "already exists: pass --overwrite"},
		{[]string{"bench", "step", "--model", "llama:tiny", "--json", earlier}, "already exists: pass --overwrite"},
		{[]string{"bench", "compare", p("cmp"), "--json", earlier}, "already exists: pass --overwrite"},
		{[]string{"bench", "cpu", "--out", p("cpu")}, "already holds cpu-compare.json: pass --overwrite"},
		{[]string{"bench", "autopilot", "--out", p("autopilot")}, "already holds autopilot.json: pass --overwrite"},
		{[]string{"bench", "generate", "--model", model, "--out", p("gen")}, "already holds generate.json: pass --overwrite"},
		{[]string{"export", "--run", runDir, "--format", "peft", "--out", exported}, "already holds an export"},
		{[]string{"pretrain", "tokenizer", "--text", story, "--out", model}, "already holds tokenizer.json: pass --overwrite"},
		{[]string{"pretrain", "llama", "--tokenizer", model, "--text", story, "--out", model}, "already holds config.json: pass --overwrite"},
		{[]string{"pretrain", "demo-data", "--fashion-mnist", p("none"), "--out", p("fashion")}, "already holds fashion-5to9-train-images.idx.gz"},
		{[]string{"pretrain", "vit", "--fashion-mnist", p("none"), "--out", p("vit")}, "already holds model.safetensors"},
		// PEFT adapter configs: every field honoured or refused by name.
		{logits(dora), "use_dora true"},
		{logits(bad("rank", map[string]any{"rank_pattern": map[string]any{"v_proj": 4}}, nil)), "rank_pattern"},
		{logits(bad("layers", map[string]any{"layers_to_transform": []any{0}}, nil)), "layers_to_transform [0] leaves out model.layers.1"},
		{logits(bad("save", map[string]any{"modules_to_save": []any{"classifier", "norm"}}, nil)), `modules_to_save names "norm"`},
		{logits(bad("unknown-target", map[string]any{"target_modules": []any{"q_proj", "v_proj", "k_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "foo_proj"}}, nil)), `target_modules names "foo_proj"`},
		{logits(bad("regex-nothing", map[string]any{"target_modules": `.*\.attention\.query`}, nil)), "target_modules names the regular expression"},
		{logits(bad("bad-regex", map[string]any{"target_modules": `(q_proj`}, nil)), "target_modules"},
		{logits(bad("partial", map[string]any{"target_modules": []any{"q_proj", "v_proj"}}, nil)), "which target_modules, exclude_modules and layers_to_transform leave out"},
		{logits(bad("exclude", map[string]any{"exclude_modules": []any{"o_proj"}}, nil)), "holds tensors for model.layers.0.self_attn.o_proj, which target_modules, exclude_modules and layers_to_transform leave out"},
		{logits(bad("missing", nil, func(v map[string][]float32, _ map[string][]int) {
			delete(v, "base_model.model.model.layers.3.mlp.up_proj.lora_A.weight")
			delete(v, "base_model.model.model.layers.3.mlp.up_proj.lora_B.weight")
		})), "target_modules selects model.layers.3.mlp.up_proj but adapter_model.safetensors has no tensors for it"},
		{logits(bad("base-tensor", nil, func(v map[string][]float32, d map[string][]int) {
			v["base_model.model.model.norm.weight"], d["base_model.model.model.norm.weight"] = make([]float32, 128), []int{128}
		})), "in no module of modules_to_save"},
		{logits(bad("bias", nil, func(v map[string][]float32, d map[string][]int) {
			v["base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias"], d["base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias"] = make([]float32, 128), []int{128}
		})), "lora_B.bias goes with lora_bias true"},
		{logits(bad("pissa", map[string]any{"init_lora_weights": "pissa_niter_4"}, nil)), "init_lora_weights is \"pissa_niter_4\""},
		{logits(bad("fan", map[string]any{"fan_in_fan_out": true}, nil)), "fan_in_fan_out"},
		{logits(bad("bias-all", map[string]any{"bias": "all"}, nil)), "bias is \"all\""},
		{logits(bad("loftq", map[string]any{"loftq_config": map[string]any{"loftq_bits": 4}}, nil)), "loftq_config is set"},
		{logits(bad("megatron", map[string]any{"megatron_config": map[string]any{"tensor_model_parallel_size": 2}}, nil)), "megatron_config is set"},
		{logits(bad("tokens", map[string]any{"trainable_token_indices": []any{5, 6}}, nil)), "trainable_token_indices is set"},
		{logits(bad("replication", map[string]any{"layer_replication": []any{[]any{0, 2}, []any{1, 4}}}, nil)), "layer_replication is set"},
		{logits(bad("qalora", map[string]any{"use_qalora": true}, nil)), "use_qalora is set"},
		{logits(bad("params", map[string]any{"target_parameters": []any{"mlp.experts.down_proj"}}, nil)), "target_parameters is set"},
		{logits(bad("alora", map[string]any{"alora_invocation_tokens": []any{5}}, nil)), "alora_invocation_tokens is set"},
		{logits(bad("corda", map[string]any{"corda_config": map[string]any{"cache_file": "x"}}, nil)), "corda_config is set"},
		{logits(bad("arrow", map[string]any{"arrow_config": map[string]any{"top_k": 3}}, nil)), "arrow_config is set"},
		{logits(bad("tying", map[string]any{"ensure_weight_tying": true}, nil)), "ensure_weight_tying is set"},
		{logits(bad("unknown-key", map[string]any{"lora_frobnication": 3}, nil)), "lora_frobnication is 3, a setting memfit does not know"},
		{logits(bad("alpha-pattern-bad", map[string]any{"alpha_pattern": map[string]any{"v_proj": "big"}}, nil)), `alpha_pattern["v_proj"] is big`},
		{trainArgs("--init-adapter", dora, "--out", p("t3")), "use_dora is true"},
		{trainArgs("--init-adapter", alpaca, "--lora-targets", "q,v", "--out", p("t4")), "lora_targets [q v] selects 8 layers but init_adapter"},
		{trainArgs("--init-adapter", alpaca, "--lora-r", "8", "--out", p("t5")), "lora_r 8 conflicts with init_adapter"},
	}
	for _, c := range cases {
		refusedUnchanged(t, tmp, c.args, c.want)
	}
	t.Logf("%d bad commands, each refused with one line, nothing changed", len(cases))

	// What --overwrite allows: an earlier result replaced, the inputs still untouched.
	if _, stderr, code := run(t, mmluOut(earlier, "--overwrite")...); code != 0 {
		t.Errorf("eval mmlu --out EARLIER --overwrite: exit %d: %s", code, stderr)
	}
	if _, stderr, code := run(t, "export", "--run", runDir, "--format", "peft", "--out", exported, "--overwrite"); code != 0 {
		t.Errorf("export --overwrite: exit %d: %s", code, stderr)
	}
}

// refusedUnchanged runs the command args and checks that it fails with a last line "finetune: ..." naming want,
// prints no panic or stack trace, and leaves every file under root as it was, with no new one.
func refusedUnchanged(t *testing.T, root string, args []string, want string) {
	t.Helper()
	before := snapshot(t, root)
	_, stderr, code := run(t, args...)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if code == 0 || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, want) {
		t.Errorf("%v: exit %d, last line %q; want a non-zero exit and a line naming %q", args, code, last, want)
	}
	for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("%v: %q in the output:\n%s", args, bad, stderr)
		}
	}
	after := snapshot(t, root)
	var changed []string
	for f, h := range before {
		if after[f] != h {
			changed = append(changed, f)
		}
	}
	for f := range after {
		if _, ok := before[f]; !ok {
			changed = append(changed, f+" (new)")
		}
	}
	sort.Strings(changed)
	if len(changed) > 0 {
		t.Errorf("%v: changed %v", args, changed)
	}
}
