package cli_test

import (
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
