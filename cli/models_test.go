package cli_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

// TestLogitsMatchGolden: finetune logits on the golden folders prints transformers' logits (1e-4 relative).
func TestLogitsMatchGolden(t *testing.T) {
	root := golden.SharedDir(t)
	for _, name := range []string{"llama_a", "llama_c", "vit_a"} {
		dir := filepath.Join(root, "golden", name)
		out, errOut, code := run(t, "logits", "--model", dir, "--inputs", filepath.Join(dir, "golden.json"))
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errOut)
		}
		var got struct{ Logits json.RawMessage }
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%s: output is not JSON: %v", name, err)
		}
		gotArr, err := golden.ParseArray(got.Logits)
		if err != nil {
			t.Fatal(err)
		}
		g := golden.Load(t, name)
		want := g.Array(t, "outputs", "logits")
		if d := golden.RelMaxDiff(gotArr.Float32s(), want.Float32s()); d > 1e-4 || len(gotArr.Dims) != len(want.Dims) {
			t.Errorf("%s: logits %v differ by %g from transformers' %v", name, gotArr.Dims, d, want.Dims)
		}
	}
}

// TestInitThenLogits: init writes a loadable checkpoint for every tiny preset and architecture kind, and two
// checkpoints made with the same seed give the same logits.
func TestInitThenLogits(t *testing.T) {
	tmp := t.TempDir()
	idsOnly := filepath.Join(tmp, "ids.json")
	os.WriteFile(idsOnly, []byte(`{"input_ids": [[1, 2, 3, 4]], "attention_mask": [[1, 1, 1, 0]]}`), 0o644)
	// One 3x32x32 image of a ramp.
	image := make([][][]float64, 3)
	for c := range image {
		image[c] = make([][]float64, 32)
		for y := range image[c] {
			image[c][y] = make([]float64, 32)
			for x := range image[c][y] {
				image[c][y][x] = float64(c*1000+y*32+x) / 3000
			}
		}
	}
	px, _ := json.Marshal(map[string]any{"pixel_values": [][][][]float64{image}})
	pxOnly := filepath.Join(tmp, "px.json")
	os.WriteFile(pxOnly, px, 0o644)
	for _, tc := range []struct {
		arch, labels, inputs string
	}{{"vit", "0", pxOnly}, {"vit", "4", pxOnly}, {"llama", "0", idsOnly}, {"llama", "3", idsOnly}} {
		var outputs []string
		for _, copy := range []string{"a", "b"} {
			dir := filepath.Join(tmp, tc.arch+tc.labels+"-"+copy)
			args := []string{"init", "--arch", tc.arch, "--preset", "tiny", "--num-labels", tc.labels, "--seed", "5", "--out", dir}
			if _, errOut, code := run(t, args...); code != 0 {
				t.Fatalf("%v: exit %d: %s", args, code, errOut)
			}
			out, errOut, code := run(t, "logits", "--model", dir, "--inputs", tc.inputs)
			if code != 0 {
				t.Fatalf("%s/%s: logits exit %d: %s", tc.arch, tc.labels, code, errOut)
			}
			outputs = append(outputs, out)
		}
		if outputs[0] != outputs[1] {
			t.Errorf("%s/%s: the same seed gave different logits", tc.arch, tc.labels)
		}
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLogitsBadInput: every broken model folder is a one-line error with exit code 1.
func TestLogitsBadInput(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join(tmp, "model")
	if _, errOut, code := run(t, "init", "--arch", "llama", "--preset", "tiny", "--out", model); code != 0 {
		t.Fatal(errOut)
	}
	inputs := filepath.Join(tmp, "in.json")
	os.WriteFile(inputs, []byte(`{"input_ids": [[1, 2, 3]]}`), 0o644)
	weights := mustRead(t, filepath.Join(model, "model.safetensors"))
	config := mustRead(t, filepath.Join(model, "config.json"))
	hlen := binary.LittleEndian.Uint64(weights[:8])

	variant := func(name string, edit func(dir string)) string {
		dir := filepath.Join(tmp, name)
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "model.safetensors"), weights, 0o644)
		os.WriteFile(filepath.Join(dir, "config.json"), config, 0o644)
		edit(dir)
		return dir
	}
	setHeader := func(dir string, f func(h string) string) {
		h := f(string(weights[8 : 8+hlen]))
		for len(h)%8 != 0 {
			h += " "
		}
		out := make([]byte, 8)
		binary.LittleEndian.PutUint64(out, uint64(len(h)))
		out = append(append(out, h...), weights[8+hlen:]...)
		os.WriteFile(filepath.Join(dir, "model.safetensors"), out, 0o644)
	}
	cases := []struct {
		name string
		dir  string
		want string
	}{
		{"truncated", variant("truncated", func(d string) {
			os.WriteFile(filepath.Join(d, "model.safetensors"), weights[:len(weights)-100], 0o644)
		}), "outside"},
		{"header-too-long", variant("header", func(d string) {
			b := append([]byte(nil), weights...)
			binary.LittleEndian.PutUint64(b, uint64(len(b)))
			os.WriteFile(filepath.Join(d, "model.safetensors"), b, 0o644)
		}), "longer than the rest of the file"},
		{"offsets", variant("offsets", func(d string) {
			setHeader(d, func(h string) string {
				return strings.Replace(h, `"data_offsets":[0,`, `"data_offsets":[0,99999999`, 1)
			})
		}), "safetensors"},
		{"dtype-shape", variant("dtype", func(d string) {
			setHeader(d, func(h string) string { return strings.Replace(h, `"dtype":"F32"`, `"dtype":"F16"`, 1) })
		}), "bytes"},
		{"missing-config", variant("noconfig", func(d string) { os.Remove(filepath.Join(d, "config.json")) }), "no config.json"},
		{"unknown-arch", variant("arch", func(d string) {
			os.WriteFile(filepath.Join(d, "config.json"), bytes.Replace(config, []byte(`"llama"`), []byte(`"mamba"`), 1), 0o644)
		}), `"model_type" is "mamba"`},
		{"missing-weights", variant("noweights", func(d string) { os.Remove(filepath.Join(d, "model.safetensors")) }), "has no model.safetensors"},
		{"missing-folder", filepath.Join(tmp, "nope"), "no config.json"},
	}
	for _, tc := range cases {
		_, errOut, code := run(t, "logits", "--model", tc.dir, "--inputs", inputs)
		msg := strings.TrimSpace(errOut)
		if code != 1 || strings.Contains(msg, "\n") || !strings.Contains(msg, tc.want) || strings.Contains(msg, "goroutine") {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 and one line containing %q", tc.name, code, errOut, tc.want)
		}
	}
}

// TestInitGuards: init into a folder holding a model is refused (exit 2) unless --overwrite, which replaces the
// model's files (a tokenizer of the old model included) and leaves other files; an absurd --num-labels is
// refused before anything is allocated.
func TestInitGuards(t *testing.T) {
	out := filepath.Join(t.TempDir(), "m")
	if _, stderr, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--out", out); code != 0 {
		t.Fatalf("first init: %d %s", code, stderr)
	}
	os.WriteFile(filepath.Join(out, "tokenizer.json"), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(out, "notes.txt"), []byte("mine"), 0o644)
	_, stderr, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", out)
	if code != 2 || !strings.Contains(stderr, "already holds a model") || !strings.Contains(stderr, "--overwrite") {
		t.Errorf("second init: exit %d, %q", code, stderr)
	}
	if _, stderr, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", out, "--overwrite"); code != 0 {
		t.Fatalf("--overwrite: %d %s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "tokenizer.json")); err == nil {
		t.Error("the old model's tokenizer survived --overwrite")
	}
	if b, _ := os.ReadFile(filepath.Join(out, "notes.txt")); string(b) != "mine" {
		t.Error("--overwrite removed a file that is not the model's")
	}
	_, stderr, code = run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "100000000", "--out", filepath.Join(t.TempDir(), "x"))
	if code != 2 || !strings.Contains(stderr, "--num-labels 100000000") {
		t.Errorf("huge --num-labels: exit %d, %q", code, stderr)
	}
	// A model whose random weights cannot fit the machine is refused with both figures before anything is
	// allocated (a 1 GiB limit stands in for a small machine).
	t.Setenv("MEMFIT_MEMORY_LIMIT", "1GiB")
	big := filepath.Join(t.TempDir(), "big")
	_, stderr, code = run(t, "init", "--arch", "llama", "--preset", "llama-1b", "--out", big)
	if code != 1 || !strings.Contains(stderr, "making its random weights takes 4.098 GiB of memory (float32) but this machine has 1.000 GiB") {
		t.Errorf("llama-1b on 1 GiB: exit %d, %q", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(big, "model.safetensors")); err == nil {
		t.Error("the refused init wrote weights")
	}
}
