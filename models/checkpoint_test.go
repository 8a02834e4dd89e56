package models_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/models/vit"
)

func tensorBytes(t *testing.T, p models.Params, name string) []byte {
	var b []byte
	if err := p[name].ConstBytes(func(x []byte) { b = append([]byte(nil), x...) }); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCheckpointRoundTrip: load -> save -> load gives identical bytes per tensor, for one file and for shards;
// the saved single file equals the golden file byte for byte.
func TestCheckpointRoundTrip(t *testing.T) {
	dir := filepath.Join(golden.SharedDir(t), "golden")
	for _, name := range []string{"llama_a", "llama_c", "vit_a"} {
		src := filepath.Join(dir, name)
		var shapes map[string][]int
		var config []byte
		if name == "vit_a" {
			cfg, err := vit.LoadConfig(src)
			if err != nil {
				t.Fatal(err)
			}
			shapes = vit.Shapes(cfg)
		} else {
			cfg, err := llama.LoadConfig(src)
			if err != nil {
				t.Fatal(err)
			}
			shapes = llama.Shapes(cfg)
		}
		config, _ = os.ReadFile(filepath.Join(src, "config.json"))
		p, err := models.LoadParams(src, shapes, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, shard := range []int64{0, 20000} {
			out := t.TempDir()
			if err := models.SaveCheckpoint(out, config, p, shard); err != nil {
				t.Fatal(err)
			}
			back, err := models.LoadParams(out, shapes, models.LoadOptions{})
			if err != nil {
				t.Fatalf("%s (shard %d): %v", name, shard, err)
			}
			for _, n := range p.Names() {
				if !bytes.Equal(tensorBytes(t, back, n), tensorBytes(t, p, n)) {
					t.Errorf("%s (shard %d): tensor %s changed", name, shard, n)
				}
			}
			files, _ := os.ReadDir(out)
			if shard == 0 {
				want, _ := os.ReadFile(filepath.Join(src, "model.safetensors"))
				got, _ := os.ReadFile(filepath.Join(out, "model.safetensors"))
				if !bytes.Equal(got, want) {
					t.Errorf("%s: saved model.safetensors differs from transformers' file", name)
				}
			} else if len(files) < 4 {
				t.Errorf("%s: sharded save wrote only %d files", name, len(files))
			}
		}
	}
}
