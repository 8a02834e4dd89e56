package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/hfhub/hubtest"
)

// standIn starts the stand-in Hub serving llama-tiny (memfit-test/llama-tiny, beside the copies in other formats a
// real repository has) and its Alpaca adapter (memfit-test/llama-tiny-alpaca), and points the Hub variables at
// it with a fresh HF_HOME, which it returns.
func standIn(t *testing.T) (*hubtest.Hub, string) {
	t.Helper()
	hub := hubtest.New(t)
	r := hub.AddDir(t, "model", "memfit-test/llama-tiny", filepath.Join("..", "pretrained", "llama-tiny"))
	r.Commits[r.Branches["main"]]["pytorch_model.bin"] = []byte("a pickle memfit must not download")
	hub.AddDir(t, "model", "memfit-test/llama-tiny-alpaca", filepath.Join("..", "pretrained", "llama-tiny-alpaca"))
	home := t.TempDir()
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_HOME", home)
	t.Setenv("HF_HUB_OFFLINE", "0")
	return hub, home
}

// TestHubModelCommands: generate, logits and export take a model and an adapter by Hub id and print what they
// print for the same local folders; memory reads the config alone; a second generate with HF_HUB_OFFLINE=1 and
// no server prints the same; a name that is neither a folder nor a repository is one line naming both.
func TestHubModelCommands(t *testing.T) {
	hub, home := standIn(t)
	local := []string{"generate", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--adapter", filepath.Join("..", "pretrained", "llama-tiny-alpaca"),
		"--prompt", "Give three tips", "--chat", "--max-new-tokens", "6"}
	want, errOut, code := run(t, local...)
	if code != 0 {
		t.Fatalf("local generate: exit %d: %s", code, errOut)
	}
	byID := []string{"generate", "--model", "memfit-test/llama-tiny", "--adapter", "memfit-test/llama-tiny-alpaca@main",
		"--prompt", "Give three tips", "--chat", "--max-new-tokens", "6"}
	got, errOut, code := run(t, byID...)
	if code != 0 || got != want {
		t.Fatalf("generate by Hub id: exit %d, %q (local: %q)\n%s", code, got, want, errOut)
	}
	if !strings.Contains(errOut, "downloading memfit-test/llama-tiny model.safetensors (4.8 MiB)") {
		t.Errorf("no download progress on stderr:\n%s", errOut)
	}
	snap := filepath.Join(home, "hub", "models--memfit-test--llama-tiny", "snapshots")
	if entries, err := os.ReadDir(snap); err != nil || len(entries) != 1 {
		t.Fatalf("%s: %v %v", snap, entries, err)
	}

	inputs := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(inputs, []byte(`{"input_ids": [[4093, 12, 99, 7]]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	wantLogits, errOut, code := run(t, "logits", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--inputs", inputs)
	if code != 0 {
		t.Fatalf("local logits: %s", errOut)
	}
	if gotLogits, errOut, code := run(t, "logits", "--model", "hf://memfit-test/llama-tiny", "--inputs", inputs); code != 0 || gotLogits != wantLogits {
		t.Errorf("logits by hf:// id: exit %d, same %v: %s", code, gotLogits == wantLogits, errOut)
	}

	// memory reads config.json alone.
	hub.Add("model", "memfit-test/llama-config-only", map[string][]byte{"config.json": mustRead(t, filepath.Join("..", "pretrained", "llama-tiny", "config.json")),
		"model.safetensors": []byte("not downloaded by memory")})
	if _, errOut, code := run(t, "memory", "--model", "memfit-test/llama-config-only", "--batch-size", "1", "--seq-len", "16", "--variants", "plain"); code != 0 {
		t.Errorf("memory by Hub id: exit %d: %s", code, errOut)
	}
	for _, r := range hub.Requests() {
		if strings.Contains(r, "llama-config-only/resolve") && !strings.HasSuffix(r, "/config.json") {
			t.Errorf("memory requested %s", r)
		}
	}

	out := filepath.Join(t.TempDir(), "merged")
	if _, errOut, code := run(t, "export", "--format", "merged", "--model", "memfit-test/llama-tiny", "--adapter", "memfit-test/llama-tiny-alpaca", "--out", out); code != 0 {
		t.Errorf("export by Hub id: exit %d: %s", code, errOut)
	} else if got, errOut, code := run(t, "generate", "--model", out, "--prompt", "Give three tips", "--chat", "--max-new-tokens", "6"); code != 0 || got != want {
		t.Errorf("the merged export generates %q (exit %d: %s), want %q", got, code, errOut, want)
	}

	// Offline, no server: the same from the cache.
	hub.Hub.Close()
	t.Setenv("HF_HUB_OFFLINE", "1")
	if got, errOut, code := run(t, byID...); code != 0 || got != want {
		t.Errorf("offline generate: exit %d, %q: %s", code, got, errOut)
	}
	_, errOut, code = run(t, "generate", "--model", "runs/typo", "--prompt", "x")
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "--model runs/typo: no such file or folder here, and HF_HUB_OFFLINE is set") {
		t.Errorf("a mistyped folder: exit %d: %s", code, errOut)
	}
}

// TestHubTrainRecordsAndResumes: train takes the base model by Hub id; run.yaml records the repository and the
// commit main resolved to; the PEFT adapter names the Hub id and that commit as its base; a run resumed after the
// cache was cleared fetches the same commit again (main has moved on meanwhile) and ends where a run straight
// through ends.
func TestHubTrainRecordsAndResumes(t *testing.T) {
	hub, home := standIn(t)
	repo := hub.Repos()["model:memfit-test/llama-tiny"]
	first := repo.Branches["main"]
	data := filepath.Join("..", "data", "hfdata", "testdata", "alpaca.jsonl")
	common := []string{"--model", "memfit-test/llama-tiny", "--data", data, "--batch-size", "4", "--seq-len", "64", "--method", "lora",
		"--log-every", "1", "--seed", "3", "--checkpoint-every", "1"}
	straight := filepath.Join(t.TempDir(), "straight")
	if _, errOut, code := run(t, append([]string{"train", "--out", straight, "--steps", "3"}, common...)...); code != 0 {
		t.Fatalf("train: exit %d: %s", code, errOut)
	}
	spec := mustRead(t, filepath.Join(straight, "run.yaml"))
	if !strings.Contains(string(spec), "model_hub:\n  commit: "+first+"\n  repo: memfit-test/llama-tiny\n") {
		t.Errorf("run.yaml does not record the repository and commit:\n%s", spec)
	}
	var peft map[string]any
	if err := json.Unmarshal(mustRead(t, filepath.Join(straight, "adapter", "adapter_config.json")), &peft); err != nil {
		t.Fatal(err)
	}
	if peft["base_model_name_or_path"] != "memfit-test/llama-tiny" || peft["revision"] != first {
		t.Errorf("adapter_config.json: base %v, revision %v", peft["base_model_name_or_path"], peft["revision"])
	}

	part := filepath.Join(t.TempDir(), "part")
	if _, errOut, code := run(t, append([]string{"train", "--out", part, "--steps", "2"}, common...)...); code != 0 {
		t.Fatalf("train: exit %d: %s", code, errOut)
	}
	// main moves on, and the cache is cleared: the resumed run fetches the commit it started from.
	hub.Commit(repo, "main", map[string][]byte{"config.json": []byte("{}")})
	if err := os.RemoveAll(filepath.Join(home, "hub")); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := run(t, "train", "--out", part, "--resume", "--steps", "3"); code != 0 {
		t.Fatalf("resume: exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(home, "hub", "models--memfit-test--llama-tiny", "snapshots", first, "model.safetensors")); err != nil {
		t.Errorf("the resumed run did not fetch commit %s: %v", first, err)
	}
	w, p := readMetrics(t, filepath.Join(straight, "metrics.jsonl")), readMetrics(t, filepath.Join(part, "metrics.jsonl"))
	if len(w) == 0 || len(p) != len(w) || w[len(w)-1]["loss"] != p[len(p)-1]["loss"] {
		t.Errorf("resumed losses %v, straight %v", p, w)
	}
}
