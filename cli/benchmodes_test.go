package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMemoryModesCommands: init --config-only writes the config alone (what memory_modes.sh cuts to fewer blocks
// and plans); bench memory-modes reads that plan's JSON into memory-modes.json; bench xla-digest reads an XLA dump.
func TestMemoryModesCommands(t *testing.T) {
	tmp := t.TempDir()
	cfgDir := filepath.Join(tmp, "cut")
	if out, errOut, code := run(t, "init", "--arch", "llama", "--preset", "tiny", "--config-only", "--out", cfgDir); code != 0 || !strings.Contains(out, "config.json only") {
		t.Fatalf("init --config-only: exit %d %s %s", code, out, errOut)
	}
	if entries, _ := os.ReadDir(cfgDir); len(entries) != 1 {
		t.Fatalf("init --config-only wrote %v, want config.json alone", entries)
	}
	modes := filepath.Join(tmp, "modes")
	if err := os.Mkdir(modes, 0o755); err != nil {
		t.Fatal(err)
	}
	plan, errOut, code := run(t, "memory", "--model", cfgDir, "--variants", "plain,grad-ckpt", "--beside", "go", "--batch-size", "1", "--seq-len", "16", "--json")
	if code != 0 {
		t.Fatalf("memory: exit %d %s", code, errOut)
	}
	if err := os.WriteFile(filepath.Join(modes, "compile__llama-1b__lora__ties1.json"), []byte(plan), 0o644); err != nil {
		t.Fatal(err)
	}
	jsonOut := filepath.Join(tmp, "memory-modes.json")
	table, errOut, code := run(t, "bench", "memory-modes", modes, "--json", jsonOut, "--checks", filepath.Join(tmp, "checks.tsv"))
	if code != 0 || !strings.Contains(table, "| llama-1b | lora | grad-ckpt | memfit |") {
		t.Fatalf("bench memory-modes: exit %d %s\n%s", code, errOut, table)
	}
	b, err := os.ReadFile(jsonOut)
	if err != nil || !strings.Contains(string(b), `"planned_bytes"`) {
		t.Errorf("memory-modes.json: %v %s", err, b)
	}
	if checks, _ := os.ReadFile(filepath.Join(tmp, "checks.tsv")); !strings.Contains(string(checks), "llama-1b lora grad-ckpt <= plain") {
		t.Errorf("checks: %s", checks)
	}
	if _, errOut, code := run(t, "bench", "memory-modes", t.TempDir()); code != 2 || !strings.Contains(errOut, "memory_modes.sh") {
		t.Errorf("an empty folder: exit %d %q", code, errOut)
	}
	digest, errOut, code := run(t, "bench", "xla-digest", filepath.Join("..", "memory", "testdata", "xladump", "peak"), "--top", "2")
	if code != 0 || !strings.Contains(digest, "custom-call __cublas$gemm") || !strings.Contains(digest, "peak 17.000 MiB") {
		t.Errorf("bench xla-digest: exit %d %s\n%s", code, errOut, digest)
	}
	if _, errOut, code := run(t, "bench", "xla-digest", t.TempDir()); code != 2 || !strings.Contains(errOut, "--xla_dump_to") {
		t.Errorf("xla-digest of an empty folder: exit %d %q", code, errOut)
	}
}
