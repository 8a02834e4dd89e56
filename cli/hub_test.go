package cli_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
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
	// --dry-run resolves the revision to its commit and downloads nothing.
	dry, errOut, code := run(t, "train", "--dry-run", "--model", "memfit-test/llama-tiny", "--data", filepath.Join(hfTestdata, "alpaca.jsonl"), "--out", filepath.Join(t.TempDir(), "dry"))
	if main := hub.Repos()["model:memfit-test/llama-tiny"].Branches["main"]; code != 0 || !strings.Contains(dry, "model_hub:\n  commit: "+main) {
		t.Errorf("--dry-run: exit %d:\n%s%s", code, dry, errOut)
	}
	for _, r := range hub.Requests() {
		if strings.Contains(r, "/resolve/") {
			t.Errorf("--dry-run requested %s", r)
		}
	}
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

	// finetune download prints the snapshot folder.
	if got, errOut, code := run(t, "download", "memfit-test/llama-tiny-alpaca"); code != 0 ||
		strings.TrimSpace(got) != filepath.Join(home, "hub", "models--memfit-test--llama-tiny-alpaca", "snapshots", hub.Repos()["model:memfit-test/llama-tiny-alpaca"].Branches["main"]) {
		t.Errorf("download: exit %d, %q: %s", code, got, errOut)
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

// TestHubTrainEndToEnd: `HF_ENDPOINT=<stand-in> finetune train --model ORG/NAME --data hf://datasets/ORG/NAME`
// trains (llama-tiny on the Alpaca parquet dataset); the files are in the huggingface_hub layout under HF_HOME
// with the served bytes, and only the train split's; a connection dropped in the middle of the weights is
// resumed in the same run; the losses equal those of the same run on the local folders; a second run with
// HF_HUB_OFFLINE=1 and no server gives the same losses.
func TestHubTrainEndToEnd(t *testing.T) {
	hub, home := standIn(t)
	ds := hub.AddDir(t, "dataset", "memfit-test/alpaca-tiny", filepath.Join(hfTestdata, "hub-alpaca"))
	weights := hub.Repos()["model:memfit-test/llama-tiny"]
	model := weights.Commits[weights.Branches["main"]]
	hub.CutAfter(hubtest.SHA256(model["model.safetensors"]), 2<<20)
	common := []string{"--batch-size", "4", "--seq-len", "64", "--method", "lora", "--log-every", "1", "--seed", "3", "--steps", "3"}
	losses := func(out string) []any {
		var l []any
		for _, m := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
			l = append(l, m["loss"])
		}
		return l
	}
	local := filepath.Join(t.TempDir(), "local")
	if _, errOut, code := run(t, append([]string{"train", "--out", local, "--model", filepath.Join("..", "pretrained", "llama-tiny"),
		"--data", filepath.Join(hfTestdata, "hub-alpaca")}, common...)...); code != 0 {
		t.Fatalf("local train: exit %d: %s", code, errOut)
	}
	byID := filepath.Join(t.TempDir(), "hub")
	args := append([]string{"train", "--out", byID, "--model", "memfit-test/llama-tiny", "--data", "hf://datasets/memfit-test/alpaca-tiny"}, common...)
	_, errOut, code := run(t, args...)
	if code != 0 {
		t.Fatalf("train by Hub ids: exit %d: %s", code, errOut)
	}
	want := losses(local)
	if got := losses(byID); len(got) != 3 || !reflect.DeepEqual(got, want) {
		t.Errorf("losses by Hub ids %v, local %v", got, want)
	}
	if !strings.Contains(errOut, "memfit-test/llama-tiny model.safetensors: connection dropped") && !strings.Contains(errOut, "resuming (try 1 of 5)") {
		t.Errorf("the dropped connection was not resumed in the run:\n%s", errOut)
	}
	// The huggingface_hub layout, with the served bytes: the train split and the card-less dataset's files only.
	dsDir := filepath.Join(home, "hub", "datasets--memfit-test--alpaca-tiny")
	commit := ds.Branches["main"]
	if ref := mustRead(t, filepath.Join(dsDir, "refs", "main")); string(ref) != commit {
		t.Errorf("refs/main %q, want %s", ref, commit)
	}
	files := ds.Commits[commit]
	for _, name := range []string{"data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"} {
		p := filepath.Join(dsDir, "snapshots", commit, filepath.FromSlash(name))
		if link, err := os.Readlink(p); err != nil || link != filepath.Join("..", "..", "..", "blobs", hubtest.SHA256(files[name])) {
			t.Errorf("%s -> %q (%v)", name, link, err)
		}
		if !bytes.Equal(mustRead(t, p), files[name]) {
			t.Errorf("%s: not the served bytes", name)
		}
	}
	if _, err := os.Lstat(filepath.Join(dsDir, "snapshots", commit, "data", "test-00000-of-00001.parquet")); err == nil {
		t.Error("the test split was downloaded")
	}
	if !bytes.Equal(mustRead(t, filepath.Join(home, "hub", "models--memfit-test--llama-tiny", "snapshots", weights.Branches["main"], "model.safetensors")), model["model.safetensors"]) {
		t.Error("the resumed weights are not the served bytes")
	}
	spec := string(mustRead(t, filepath.Join(byID, "run.yaml")))
	if !strings.Contains(spec, "data_hub:\n  commit: "+commit+"\n  repo: memfit-test/alpaca-tiny\n") {
		t.Errorf("run.yaml does not record the dataset:\n%s", spec)
	}

	// Offline, without the server: the same losses.
	hub.Hub.Close()
	hub.CDN.Close()
	t.Setenv("HF_HUB_OFFLINE", "1")
	offline := filepath.Join(t.TempDir(), "offline")
	args[2] = offline
	if _, errOut, code := run(t, args...); code != 0 {
		t.Fatalf("offline train: exit %d: %s", code, errOut)
	}
	if got := losses(offline); !reflect.DeepEqual(got, want) {
		t.Errorf("offline losses %v, want %v", got, want)
	}
}

// TestHubDatasets: a dataset card's configs choose the files (--data-config, the card's default), as they do in
// the same folder on disk; a dataset without parquet files is read from the Hub's parquet conversion
// (refs/convert/parquet); a URL naming one file reads that file; finetune download fetches ahead of time, so
// that an offline run needs nothing more; the tree listing is followed across pages. Each first loss is the one
// of the same files read locally.
func TestHubDatasets(t *testing.T) {
	hub, home := standIn(t)
	hub.PageSize = 2
	tiny := filepath.Join("..", "pretrained", "llama-tiny")
	common := []string{"--batch-size", "4", "--seq-len", "96", "--method", "lora"}
	shard0 := mustRead(t, filepath.Join(hfTestdata, "hub-alpaca", "data", "train-00000-of-00002.parquet"))
	shard1 := mustRead(t, filepath.Join(hfTestdata, "hub-alpaca", "data", "train-00001-of-00002.parquet"))
	card := "---\nconfigs:\n- config_name: small\n  default: true\n  data_files:\n  - split: train\n    path: custom/part-a.parquet\n" +
		"- config_name: full\n  data_files:\n  - split: train\n    path: custom/part-*.parquet\n---\n# Alpaca in two parts\n"
	files := map[string][]byte{"README.md": []byte(card), "custom/part-a.parquet": shard0, "custom/part-b.parquet": shard1,
		"data/train-00000-of-00001.parquet": mustRead(t, filepath.Join(hfTestdata, "alpaca.duckdb.parquet"))}
	hub.Add("dataset", "memfit-test/alpaca-card", files)
	localCard := t.TempDir()
	for name, data := range files {
		if err := os.MkdirAll(filepath.Join(localCard, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(localCard, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, config := range []string{"", "full"} {
		args := append([]string{"--model", tiny}, common...)
		if config != "" {
			args = append(args, "--data-config", config)
		}
		want := firstLoss(t, append(args, "--data", localCard)...)
		if got := firstLoss(t, append(args, "--data", "hf://datasets/memfit-test/alpaca-card")...); got != want {
			t.Errorf("card config %q: first loss %v, local %v", config, got, want)
		}
	}
	if want, part := firstLoss(t, append([]string{"--model", tiny, "--data", filepath.Join(hfTestdata, "hub-alpaca")}, common...)...),
		firstLoss(t, append([]string{"--model", tiny, "--data", localCard, "--data-config", "full"}, common...)...); want != part {
		t.Errorf("the card's full config (both shards) %v, the hub folder's train split %v", part, want)
	}
	for _, r := range hub.Requests() {
		if strings.Contains(r, "data/train-00000-of-00001.parquet") {
			t.Errorf("a file no config names was requested: %s", r)
		}
	}
	_, errOut, code := run(t, append([]string{"train", "--out", filepath.Join(t.TempDir(), "x"), "--steps", "1", "--model", tiny,
		"--data", "hf://datasets/memfit-test/alpaca-card", "--data-config", "nope"}, common...)...)
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, `has no config "nope": its card (README.md) names small, full`) {
		t.Errorf("unknown config: exit %d: %s", code, errOut)
	}

	// JSONL only: the Hub's parquet conversion is read; one file by URL is read as that file.
	jsonl := mustRead(t, filepath.Join(hfTestdata, "alpaca.jsonl"))
	conv := hub.Add("dataset", "memfit-test/alpaca-jsonl", map[string][]byte{"alpaca.jsonl": jsonl, "README.md": []byte("# no configs\n")})
	convCommit := hub.Commit(conv, "refs/convert/parquet", map[string][]byte{"default/train/0000.parquet": mustRead(t, filepath.Join(hfTestdata, "alpaca.duckdb.parquet")),
		"default/test/0000.parquet": shard1})
	want := firstLoss(t, append([]string{"--model", tiny, "--data", filepath.Join(hfTestdata, "alpaca.jsonl")}, common...)...)
	out := filepath.Join(t.TempDir(), "conv")
	_, errOut, code = run(t, append([]string{"train", "--out", out, "--steps", "1", "--log-every", "1", "--seed", "3", "--model", tiny,
		"--data", "hf://datasets/memfit-test/alpaca-jsonl"}, common...)...)
	if code != 0 || !strings.Contains(errOut, "reading the Hub's parquet conversion of it (refs/convert/parquet, commit "+convCommit[:12]+")") {
		t.Fatalf("conversion: exit %d:\n%s", code, errOut)
	}
	if got := readMetrics(t, filepath.Join(out, "metrics.jsonl"))[0]["loss"]; got != want {
		t.Errorf("conversion: first loss %v, the JSONL's %v", got, want)
	}
	dsDir := filepath.Join(home, "hub", "datasets--memfit-test--alpaca-jsonl")
	if ref := mustRead(t, filepath.Join(dsDir, "refs", "refs", "convert", "parquet")); string(ref) != convCommit {
		t.Errorf("refs/refs/convert/parquet holds %q", ref)
	}
	if _, err := os.Lstat(filepath.Join(dsDir, "snapshots", convCommit, "default", "test", "0000.parquet")); err == nil {
		t.Error("the conversion's test split was downloaded")
	}
	if spec := string(mustRead(t, filepath.Join(out, "run.yaml"))); !strings.Contains(spec, "data_hub:\n  commit: "+convCommit+"\n  path: default\n  repo: memfit-test/alpaca-jsonl\n  revision: refs/convert/parquet\n") {
		t.Errorf("run.yaml:\n%s", spec)
	}
	if got := firstLoss(t, append([]string{"--model", tiny, "--data", "hf://datasets/memfit-test/alpaca-jsonl/alpaca.jsonl"}, common...)...); got != want {
		t.Errorf("one file by URL: first loss %v, want %v", got, want)
	}

	// No parquet and no conversion: one line.
	hub.Add("dataset", "memfit-test/csv-only", map[string][]byte{"train.csv": []byte("a,b\n1,2\n")})
	_, errOut, code = run(t, append([]string{"train", "--out", filepath.Join(t.TempDir(), "y"), "--steps", "1", "--model", tiny,
		"--data", "hf://datasets/memfit-test/csv-only"}, common...)...)
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "and the Hub has no parquet conversion of it") {
		t.Errorf("csv only: exit %d: %s", code, errOut)
	}

	// finetune download, then offline with no server.
	got, errOut, code := run(t, "download", "hf://datasets/memfit-test/alpaca-tiny2")
	if code != 1 || !strings.Contains(errOut, "no such dataset") {
		t.Errorf("download of a missing dataset: exit %d: %s %s", code, got, errOut)
	}
	hub.AddDir(t, "dataset", "memfit-test/alpaca-tiny2", filepath.Join(hfTestdata, "hub-alpaca"))
	if got, errOut, code = run(t, "download", "hf://datasets/memfit-test/alpaca-tiny2", "--split", "test"); code != 0 ||
		!strings.HasSuffix(strings.TrimSpace(got), filepath.Join("datasets--memfit-test--alpaca-tiny2", "snapshots", hub.Repos()["dataset:memfit-test/alpaca-tiny2"].Branches["main"])) {
		t.Errorf("download: exit %d, %q: %s", code, got, errOut)
	}
	hub.Hub.Close()
	t.Setenv("HF_HUB_OFFLINE", "1")
	small := []string{"--model", tiny, "--batch-size", "2", "--seq-len", "96", "--method", "lora", "--split", "test"}
	wantTest := firstLoss(t, append(small, "--data", filepath.Join(hfTestdata, "hub-alpaca"))...)
	if got := firstLoss(t, append(small, "--data", "hf://datasets/memfit-test/alpaca-tiny2")...); got != wantTest {
		t.Errorf("offline after download: first loss %v, want %v", got, wantTest)
	}
}
