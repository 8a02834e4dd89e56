package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
)

// The cases of the probe of 2026-11-27 (b) (docs/probes/probe-2026-11-27-b.md) of the Hub, preference tuning and
// the models' chat templates that were unclear, silent-wrong, hung or crashed: each gave the old behaviour
// before its fix.

// refusedB runs args and wants a non-zero exit whose last line (after any notes or download progress) names
// want, and no Go internals in the output.
func refusedB(t *testing.T, args []string, want string) {
	t.Helper()
	_, stderr, code := run(t, args...)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if code == 0 || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, want) {
		t.Errorf("%v: exit %d, last line %q; want a non-zero exit and a line naming %q", args, code, last, want)
	}
	for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:", ".Model", "stat ", "<nil>"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("%v: %q in the output:\n%s", args, bad, stderr)
		}
	}
}

// TestProbeBHub: the Hub cases (section 1).
func TestProbeBHub(t *testing.T) {
	hub, home := standIn(t)
	commit := hub.Repos()["model:memfit-test/llama-tiny-alpaca"].Branches["main"]
	snap := filepath.Join(home, "hub", "models--memfit-test--llama-tiny-alpaca", "snapshots", commit)
	// w18, w19: download takes the model spellings --model takes (it said "a Hub dataset is hf://datasets/...").
	for _, name := range []string{"hf://memfit-test/llama-tiny-alpaca", "hf://models/memfit-test/llama-tiny-alpaca"} {
		if out, errOut, code := run(t, "download", name); code != 0 || strings.TrimSpace(out) != snap {
			t.Errorf("download %s: exit %d, %q: %s", name, code, out, errOut)
		}
	}
	// u6: --init-adapter by Hub id (it was read as a local path: "init_adapter: stat ORG/NAME/adapter_config.json").
	out, errOut, code := run(t, "train", "--dry-run", "--model", "memfit-test/llama-tiny", "--init-adapter", "memfit-test/llama-tiny-alpaca",
		"--data", filepath.Join(hfTestdata, "alpaca.jsonl"), "--out", filepath.Join(t.TempDir(), "run"))
	if code != 0 || !strings.Contains(out, "init_adapter_hub:\n  commit: "+commit+"\n  repo: memfit-test/llama-tiny-alpaca") || !strings.Contains(out, "init_adapter: "+snap) {
		t.Errorf("--init-adapter by Hub id: exit %d:\n%s%s", code, out, errOut)
	}
	// hr2: a run's base model gone from the cache, resumed offline: it said "no such file or folder here, and ...",
	// of a path the user never gave.
	runDir := filepath.Join(t.TempDir(), "hubrun")
	if _, errOut, code := run(t, "train", "--model", "memfit-test/llama-tiny", "--data", filepath.Join(hfTestdata, "alpaca.jsonl"), "--steps", "1",
		"--batch-size", "2", "--seq-len", "64", "--checkpoint-every", "1", "--out", runDir); code != 0 {
		t.Fatalf("train by Hub id: exit %d: %s", code, errOut)
	}
	if err := os.RemoveAll(filepath.Join(home, "hub")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HF_HUB_OFFLINE", "1")
	refusedB(t, []string{"train", "--out", runDir, "--resume", "--steps", "2"}, "finetune: the run's base model: HF_HUB_OFFLINE is set and model memfit-test/llama-tiny@")
	t.Setenv("HF_HUB_OFFLINE", "0")
	// u1: the datasets library's spelling of a dataset.
	refusedB(t, []string{"train", "--model", "memfit-test/llama-tiny", "--data", "memfit-test/alpaca", "--out", filepath.Join(t.TempDir(), "r")},
		"--data memfit-test/alpaca: no such file or folder here; a Hub dataset is named hf://datasets/memfit-test/alpaca")
	// u5, u9: a model given as the adapter (it said "stat .../adapter_config.json: no such file or directory").
	refusedB(t, []string{"generate", "--model", "memfit-test/llama-tiny", "--adapter", "memfit-test/llama-tiny", "--prompt", "x"},
		"is a model folder (config.json), not a PEFT adapter (adapter_config.json)")
	// s1: an empty folder named like the id shadows it (it said "no config.json (is this a Hugging Face model folder?)").
	alpaca, err := filepath.Abs(filepath.Join(hfTestdata, "alpaca.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	if err := os.MkdirAll(filepath.Join("memfit-test", "llama-tiny"), 0o755); err != nil {
		t.Fatal(err)
	}
	refusedB(t, []string{"generate", "--model", "memfit-test/llama-tiny", "--prompt", "x"},
		"the folder memfit-test/llama-tiny here holds no model (no config.json or adapter_config.json); to read the Hub's memfit-test/llama-tiny instead, name it hf://memfit-test/llama-tiny")
	if out, errOut, code := run(t, "generate", "--model", "hf://memfit-test/llama-tiny", "--prompt", "x", "--max-new-tokens", "2"); code != 0 || out == "" {
		t.Errorf("hf:// beside a folder of that name: exit %d: %s", code, errOut)
	}
	// t3: --data-config on a file without configs (it was ignored).
	refusedB(t, []string{"train", "--model", "hf://memfit-test/llama-tiny", "--data", alpaca, "--data-config", "x", "--out", "r"},
		"--data-config picks a config of a parquet dataset")
}

// TestProbeBHubMessages: the Hub's own messages (section 1: d6, e1, e4, e5).
func TestProbeBHubMessages(t *testing.T) {
	hub, _ := standIn(t)
	hub.Add("dataset", "memfit-test/jsonl", map[string][]byte{"data/train.jsonl": mustRead(t, filepath.Join(hfTestdata, "alpaca.jsonl"))})
	// d6: it said "holds no parquet files (not parquet: hf://... holds no parquet files (1 other files): not parquet) and ...".
	refusedB(t, []string{"download", "hf://datasets/memfit-test/jsonl"},
		"dataset memfit-test/jsonl holds no parquet files (its files: data/train.jsonl) and the Hub has no parquet conversion of it (refs/convert/parquet): name one file, e.g. hf://datasets/memfit-test/jsonl/data/train.jsonl")
	// e1: an HF_ENDPOINT that is no address (five tries, 25 s, "unsupported protocol scheme").
	t.Setenv("HF_ENDPOINT", "huggingface.co")
	refusedB(t, []string{"download", "memfit-test/llama-tiny"}, "cannot reach the Hub at huggingface.co: HF_ENDPOINT is not an http(s) address")
	// e4: an HF_ENDPOINT with a wrong path answers 404 "no such page" (it said "no such model ..., or it is private").
	t.Setenv("HF_ENDPOINT", hub.URL()+"/mirror")
	refusedB(t, []string{"download", "memfit-test/llama-tiny"}, "HF_ENDPOINT is not a Hugging Face Hub (or mirror) address, or the repository is not there")
}

// writePairsParquet writes preference pairs as parquet with the column names question, good and bad.
func writePairsParquet(t *testing.T, path string, n int) {
	t.Helper()
	type row struct {
		Question string `parquet:"question"`
		Good     string `parquet:"good"`
		Bad      string `parquet:"bad"`
	}
	rows := make([]row, n)
	for i := range rows {
		rows[i] = row{Question: "Name a colour of the sky:", Good: " blue, on a clear day", Bad: " green, like grass"}
	}
	if err := parquet.WriteFile(path, rows); err != nil {
		t.Fatal(err)
	}
}

// TestProbeBPreference: the preference cases (section 2).
func TestProbeBPreference(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join("..", "pretrained", "llama-tiny")
	write := func(name string, rows ...string) string {
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := `{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}`
	train := func(data string, extra ...string) []string {
		return append([]string{"train", "--model", model, "--data", data, "--objective", "dpo", "--steps", "1", "--batch-size", "2",
			"--seq-len", "64", "--out", filepath.Join(tmp, "run-"+filepath.Base(data))}, extra...)
	}
	// pm13: a completion of spaces (accepted, where "" and conversations' empty content are refused).
	refusedB(t, train(write("spaces.jsonl", good, `{"prompt": "a", "chosen": "   ", "rejected": " b"}`)), `spaces.jsonl:2: "chosen" and "rejected" must not be empty (or only spaces)`)
	// pc05: grammar.
	refusedB(t, train(write("asst.jsonl", `{"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "chosen": [{"role": "assistant", "content": "c"}], "rejected": [{"role": "assistant", "content": "d"}]}`)),
		`"prompt" ends with an assistant message`)
	// pm08: identical completions train silently.
	_, stderr, code := run(t, train(write("same.jsonl", good, good, `{"prompt": "The sky is", "chosen": " blue.", "rejected": " blue."}`))...)
	if code != 0 || !strings.Contains(stderr, "note: "+filepath.Join(tmp, "same.jsonl")+": 1 of 3 pairs have the same chosen and rejected completion") {
		t.Errorf("identical pairs: exit %d:\n%s", code, stderr)
	}
	// pq03: --columns renames the pair columns of parquet data (it said "memfit reads no column prompt").
	pq := filepath.Join(tmp, "pairs.parquet")
	writePairsParquet(t, pq, 4)
	if _, stderr, code := run(t, train(pq, "--columns", "prompt=question,chosen=good,rejected=bad")...); code != 0 {
		t.Errorf("--columns on parquet pairs: exit %d:\n%s", code, stderr)
	}
	// pp6, pp9, pp10, pp13: pretrain preference-data reads and writes JSONL.
	alpaca := filepath.Join(hfTestdata, "alpaca.jsonl")
	pd := func(in, out string) []string {
		return []string{"pretrain", "preference-data", "--data", in, "--out", out}
	}
	refusedB(t, pd(alpaca, tmp), "is a folder: give a file name, e.g. "+filepath.Join(tmp, "pairs.jsonl"))
	refusedB(t, pd(alpaca, filepath.Join(tmp, "p.parquet")), "the pairs are written as JSONL: give a name ending in .jsonl")
	refusedB(t, pd(filepath.Join(hfTestdata, "alpaca.duckdb.parquet"), filepath.Join(tmp, "p.jsonl")), "is parquet: preference-data reads Alpaca JSONL")
	refusedB(t, pd("hf://datasets/a/b", filepath.Join(tmp, "p.jsonl")), "preference-data reads a local Alpaca JSONL file")
	if _, err := os.Stat(filepath.Join(tmp, "p.parquet")); err == nil {
		t.Error("a JSONL file was written under a .parquet name")
	}
	// mem5, mem9, mem6: no Go type names; what ipo is.
	refusedB(t, []string{"memory", "--model", filepath.Join("..", "pretrained", "vit-fashion"), "--objective", "dpo", "--batch-size", "1", "--variants", "plain"},
		"objective dpo trains a causal language model; this model is a ViT")
	refusedB(t, []string{"memory", "--model", "llama-1b", "--objective", "ipo"}, `objective must be dpo or orpo, got "ipo": IPO is a DPO loss (objective dpo, dpo_loss ipo)`)

	// pb01: the memory autopilot of a DPO run planned sequences of 0 tokens and stopped ("a LLaMA step plan needs a
	// sequence length from 1 ..."); pb08: the machine check passed a DPO step over without planning it.
	dpo := write("dpo.jsonl", good, good, good, good)
	if _, stderr, code := run(t, train(dpo, "--budget", "80MiB")...); code != 0 || !strings.Contains(stderr, "memory autopilot: budget 80.000 MiB") {
		t.Errorf("DPO with --budget: exit %d:\n%s", code, stderr)
	}
	t.Setenv("MEMFIT_MEMORY_LIMIT", "1MiB")
	refusedB(t, train(dpo, "--out", filepath.Join(tmp, "too-big")), "the training step needs")
	t.Setenv("MEMFIT_MEMORY_LIMIT", "")

	// kp2: a damaged reference cache was blamed on the data ("resume with the data the run started with").
	pairs := write("pairs.jsonl", good, `{"prompt": "Grass is", "chosen": " green.", "rejected": " blue."}`, good, `{"prompt": "Snow is", "chosen": " white.", "rejected": " black."}`)
	out := filepath.Join(tmp, "dpo-ref")
	if _, stderr, code := run(t, "train", "--model", model, "--data", pairs, "--objective", "dpo", "--precompute-ref", "--steps", "1", "--batch-size", "2",
		"--seq-len", "32", "--checkpoint-every", "1", "--out", out); code != 0 {
		t.Fatalf("precompute-ref run: exit %d:\n%s", code, stderr)
	}
	cache := filepath.Join(out, "reference-logps.safetensors")
	b := mustRead(t, cache)
	b[len(b)-2] ^= 0x40
	if err := os.WriteFile(cache, b, 0o644); err != nil {
		t.Fatal(err)
	}
	refusedB(t, []string{"train", "--out", out, "--resume", "--steps", "2"}, cache+": the train reference log-likelihoods do not match the checksum written with them: the file is corrupt")
}

// templated copies llama-tiny to dir with chat templates: tokenizer_config.json's (config, "" for none) and
// chat_template.jinja (jinja, "" for none).
func templated(t *testing.T, dir, config, jinja string) string {
	t.Helper()
	copyTree(t, filepath.Join("..", "pretrained", "llama-tiny"), dir)
	p := filepath.Join(dir, "tokenizer_config.json")
	var cfg map[string]any
	if err := json.Unmarshal(mustRead(t, p), &cfg); err != nil {
		t.Fatal(err)
	}
	if config != "" {
		cfg["chat_template"] = config
	}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if jinja != "" {
		if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte(jinja), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A chat template for llama-tiny's tokenizer (its end of turn is EOS).
const (
	tinyTemplate  = "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
	tinyTemplate2 = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)

// TestProbeBChatTemplates: the chat-template cases (section 3).
func TestProbeBChatTemplates(t *testing.T) {
	tmp := t.TempDir()
	conv := filepath.Join(tmp, "chat.jsonl")
	var rows []string
	for i := range 4 {
		rows = append(rows, `{"messages": [{"role": "user", "content": "Say `+string(rune('a'+i))+`"}, {"role": "assistant", "content": "It is said."}]}`)
	}
	if err := os.WriteFile(conv, []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// tg_jinjadir: a chat_template.jinja that is a folder was passed over for tokenizer_config.json's template.
	dir := templated(t, filepath.Join(tmp, "jinjadir"), tinyTemplate, "")
	if err := os.Mkdir(filepath.Join(dir, "chat_template.jinja"), 0o755); err != nil {
		t.Fatal(err)
	}
	refusedB(t, []string{"generate", "--model", dir, "--chat", "--prompt", "hi"}, "the model's chat template: "+filepath.Join(dir, "chat_template.jinja")+" is a folder")
	// tt_both: chat_template.jinja wins over another tokenizer_config.json template, and now says so.
	both := templated(t, filepath.Join(tmp, "both"), tinyTemplate, tinyTemplate2)
	_, stderr, code := run(t, "generate", "--model", both, "--chat", "--prompt", "hi", "--max-new-tokens", "1")
	wantNote := "model (chat_template.jinja; tokenizer_config.json's different chat_template is not used, as in transformers)"
	if code != 0 || !strings.Contains(stderr, "note: the chat template is "+wantNote) {
		t.Errorf("generate with both templates: exit %d:\n%s", code, stderr)
	}
	// cg4: --chat-template without --chat was ignored.
	refusedB(t, []string{"generate", "--model", both, "--chat-template", "model", "--prompt", "hi"}, "--chat-template model renders prompts with --chat")
	// rt1r: a resume after the model's template changed blamed the data file.
	model := templated(t, filepath.Join(tmp, "model"), tinyTemplate, "")
	out := filepath.Join(tmp, "run")
	_, stderr, code = run(t, "train", "--model", model, "--data", conv, "--steps", "1", "--batch-size", "2", "--seq-len", "64", "--checkpoint-every", "1", "--out", out)
	if code != 0 || !strings.Contains(stderr, "conversations take the chat template model (tokenizer_config.json)") {
		t.Fatalf("train: exit %d:\n%s", code, stderr)
	}
	templated(t, model, tinyTemplate2, "")
	refusedB(t, []string{"train", "--out", out, "--resume", "--steps", "2"},
		"other token ids (the conversations as the chat template model renders them: if the file did not change, the template or the tokenizer did)")
	// pc11: conversational pairs record the template they took in run.yaml, as conversations do.
	pairs := filepath.Join(tmp, "pairs.jsonl")
	row := `{"prompt": [{"role": "user", "content": "Sky?"}], "chosen": [{"role": "assistant", "content": "Blue."}], "rejected": [{"role": "assistant", "content": "Green."}]}`
	if err := os.WriteFile(pairs, []byte(row+"\n"+row+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pout := filepath.Join(tmp, "dpo")
	if _, stderr, code := run(t, "train", "--model", model, "--data", pairs, "--objective", "dpo", "--steps", "1", "--batch-size", "2", "--seq-len", "64", "--out", pout); code != 0 {
		t.Fatalf("dpo on conversational pairs: exit %d:\n%s", code, stderr)
	}
	if spec := string(mustRead(t, filepath.Join(pout, "run.yaml"))); !strings.Contains(spec, "data_options:\n  chat_template: model\n") {
		t.Errorf("run.yaml of conversational pairs records no chat template:\n%s", spec)
	}
}
