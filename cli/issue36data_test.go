package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 36, the data half: the probe's (../shared/notes/probe-2026-11-27.md) parquet, hub-folder, conversation and
// validation-data cases, each by its id. Every refusal is one line on stderr naming the cause, a non-zero exit,
// and no output folder.

// refused36 runs args and checks that train refused them with exactly one line holding want, and wrote nothing
// at out.
func refused36(t *testing.T, out string, args []string, want string) {
	t.Helper()
	_, stderr, code := run(t, args...)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if code == 0 || len(lines) != 1 || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, want) {
		t.Errorf("%v: exit %d, %d line(s), last %q; want a non-zero exit and one line naming %q", args, code, len(lines), last, want)
	}
	for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:", "Go value", "of type ", "<nil>"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("%v: %q in the output:\n%s", args, bad, stderr)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("%v: %s was written", args, out)
		os.RemoveAll(out)
	}
}

// probe36 is the folder of the probe's DuckDB-written fixtures (tools/parquet-fixtures/make.mjs).
func probe36(name string) string { return filepath.Join(hfTestdata, "probe", name) }

// TestProbe36MapColumns (pq22, pq24, pq25, mp01, mp02, mp04, mp05): a MAP column (as DuckDB writes one) under each
// name memfit type-checks, through --columns and through --eval-data, is refused naming its type; before, each
// killed the process with a stack overflow.
func TestProbe36MapColumns(t *testing.T) {
	tmp := t.TempDir()
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	cls := filepath.Join(tmp, "cls")
	mustRun(t, "init", "--from", llama, "--num-labels", "2", "--out", cls)
	vit := filepath.Join(tmp, "vit")
	mustRun(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "2", "--out", vit)
	out := filepath.Join(tmp, "run")
	train := func(model string, more ...string) []string {
		return append([]string{"train", "--model", model, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "64"}, more...)
	}
	m := probe36("map.parquet")
	for _, c := range []struct {
		args []string
		want string
	}{
		{train(llama, "--data", m, "--columns", "text=m"), `map.parquet: column "m" is map<string, string>, but memfit reads text as a string`},
		{train(llama, "--data", m, "--columns", "messages=m"), `map.parquet: column "m" is map<string, string>, but memfit reads messages as a list of struct{role, content}`},
		{train(llama, "--data", m, "--columns", "instruction=m,output=sentence"), `map.parquet: column "m" is map<string, string>, but memfit reads instruction as a string`},
		{train(cls, "--data", m, "--task", "sst2", "--columns", "label=m"), `map.parquet: column "m" is map<string, string>, but memfit reads label as an integer`},
		{train(vit, "--data", m, "--columns", "image=m"), `map.parquet: column "m" is map<string, string>, but memfit reads image as an image`},
		{train(llama, "--data", filepath.Join(hfTestdata, "text.duckdb.parquet"), "--eval-data", probe36("map-text.parquet")), `map-text.parquet: column "text" is map<string, string>, but memfit reads text as a string`},
	} {
		refused36(t, out, c.args, c.want)
	}
}

// hubLayout copies the fixture src to each relative path under a new folder and returns the folder.
func hubLayout(t *testing.T, src string, paths ...string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, p := range paths {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// examplesNoted returns the count of examples a train run's notes give ("N of M examples ...": M), or -1.
func examplesNoted(stderr string) int {
	for _, line := range strings.Split(stderr, "\n") {
		var n, m int
		if i := strings.Index(line, " examples are longer than"); i > 0 {
			head := line[:i]
			if j := strings.LastIndex(head, ": "); j >= 0 {
				if _, err := fmt.Sscanf(head[j+2:], "%d of %d", &n, &m); err == nil {
					return m
				}
			}
		}
	}
	return -1
}

// TestProbe36HubLayouts: a hub folder whose splits are in a config folder (plain_text/train-*, plain_text/test-*)
// trains on plain_text's train split alone, and --split plain_text is refused (hf09, hf18: it was offered as a
// split and then read train and test together); SPLIT.parquet, data/SPLIT.parquet and .PARQUET folders train
// (hf10, hf11, hf12: "no parquet files", "image data needs a ViT model"); a looping link is named (hf16).
func TestProbe36HubLayouts(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "run")
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	src := filepath.Join(hfTestdata, "alpaca.duckdb.parquet")
	train := func(data string, more ...string) []string {
		return append([]string{"train", "--model", llama, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "64"}, more...)
	}
	trains := func(args []string, note string) string {
		t.Helper()
		os.RemoveAll(out)
		_, stderr, code := run(t, args...)
		if code != 0 || !strings.Contains(stderr, note) {
			t.Errorf("%v: exit %d; want 0 and the note %q:\n%s", args[3:6], code, note, stderr)
		}
		return stderr
	}
	one := examplesNoted(trains(train(src), "read as Alpaca rows"))
	cfg := hubLayout(t, src, "plain_text/train-00000-of-00001.parquet", "plain_text/test-00000-of-00001.parquet")
	if got := examplesNoted(trains(train(cfg), cfg+" (config plain_text, split train): 1 parquet file(s): read as Alpaca rows")); got != one || one <= 0 {
		t.Errorf("config folder: %d examples, one file has %d (train and test mixed?)", got, one)
	}
	os.RemoveAll(out)
	refused36(t, out, train(cfg, "--split", "plain_text"), `"plain_text" is a config of this dataset (a folder of splits: test, train), not a split: read it with --data `+filepath.Join(cfg, "plain_text"))
	for _, l := range []string{"train.parquet", "data/train.parquet", "data/train-00000-of-00001.PARQUET"} {
		root := hubLayout(t, src, l, strings.Replace(l, "train", "test", 1))
		trains(train(root), root+" (split train): 1 parquet file(s): read as Alpaca rows")
	}
	loop := t.TempDir()
	os.MkdirAll(filepath.Join(loop, "data"), 0o755)
	if err := os.Symlink("train", filepath.Join(loop, "data", "train")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(out)
	refused36(t, out, train(loop), filepath.Join(loop, "data", "train")+" is a symbolic link that loops")
}
