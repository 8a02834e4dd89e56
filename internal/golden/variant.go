package golden

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/safetensors"
)

// Variant writes to dir the golden model name (../shared/data/golden/NAME: config.json and model.safetensors)
// with its config.json and weights edited by edit (nil: copied), and returns dir: a hidden configuration of a
// golden model's family (untied, other settings) whose reference is memfit itself.
func Variant(t testing.TB, name, dir string, edit func(cfg map[string]any, weights map[string]*tensors.Tensor)) string {
	t.Helper()
	src := filepath.Join(SharedDir(t), "golden", name)
	raw, err := readfile.Read(filepath.Join(src, "config.json"), readfile.Config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ts := map[string]*tensors.Tensor{}
	for _, n := range f.Names() {
		if ts[n], err = f.Tensor(n); err != nil {
			t.Fatal(err)
		}
	}
	if edit != nil {
		edit(cfg, ts)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteTensors(filepath.Join(dir, "model.safetensors"), ts, "", nil); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
