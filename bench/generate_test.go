package bench

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/runner"
	"github.com/memfit/memfit/tokenizer"
)

// TestGenerateCompare runs the generation comparison on the shipped llama-tiny against the plain-PyTorch
// reference (skipped without Debian's python3-torch): both sides decode the same greedy tokens, both report
// throughput, and the table names them.
func TestGenerateCompare(t *testing.T) {
	py := torchPython(t)
	dir := filepath.Join("..", "pretrained", "llama-tiny")
	m, err := llama.Load(dir, decoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	backend := gtest.Backend(t)
	abs, _ := filepath.Abs(dir)
	run, err := RunGenerateCompare(GenerateCompareOptions{Model: abs, Gen: runner.NewGenerator(backend, lm.Model{Model: m, Spec: llama.Spec}, nil, nil),
		Tok: tok, Batches: []int{1, 3}, PromptLen: 16, NewTokens: 12, Runs: 1, Python: []string{py, filepath.Join("pytorch", "generate_compare.py")},
		WorkDir: t.TempDir(), OutDir: t.TempDir(), Backend: backend, Log: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Problems) > 0 || len(run.Cases) != 2 {
		t.Fatalf("problems %v, %d cases", run.Problems, len(run.Cases))
	}
	for _, c := range run.Cases {
		if !c.SameTokens || c.Memfit <= 0 || c.PyTorch <= 0 || len(c.MemfitSide.Tokens) != c.Batch || len(c.MemfitSide.Tokens[0]) != 12 {
			t.Errorf("batch %d: same tokens %v (%s), %g and %g tokens/s, tokens %v", c.Batch, c.SameTokens, c.FirstDifference, c.Memfit, c.PyTorch, c.MemfitSide.Tokens)
		}
	}
	var table bytes.Buffer
	if err := WriteGenerateRun(&table, run); err != nil || !strings.Contains(table.String(), "memfit / PyTorch") {
		t.Errorf("table: %v\n%s", err, table.String())
	}
}
