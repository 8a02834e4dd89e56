package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/bench"
)

// TestBenchCPUStep runs one memfit process of `bench cpu` on a tiny ViT spec, as the driver does, and reads the
// result it writes.
func TestBenchCPUStep(t *testing.T) {
	dir := t.TempDir()
	ckpt, err := bench.PresetCheckpoint("llama:tiny", 0, dir)
	if err != nil {
		t.Fatal(err)
	}
	s := bench.DefaultCPUSettings()
	s.Warmup, s.Steps = 1, 1
	spec := bench.CPUSpec{Case: bench.CPUCase{Key: "t", Name: "tiny", Model: ckpt, Method: "lora-all", Batch: 2, Seq: 8},
		Settings: s, BatchFile: filepath.Join(dir, "batch.safetensors"), InitFile: filepath.Join(dir, "init.safetensors")}
	if err := bench.WriteCPUBatch(spec.Case, s, spec.BatchFile); err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(dir, "spec.json")
	b, _ := json.Marshal(spec)
	os.WriteFile(specFile, b, 0o644)
	out := filepath.Join(dir, "out.json")
	prof := filepath.Join(dir, "cpu.pprof")
	if _, errOut, code := run(t, "bench", "cpu", "step", "--spec", specFile, "--variant", "approx-act+ms-norm", "--json", out,
		"--write-init", "--cpuprofile", prof); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	b, err = os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r bench.CPUSideResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Side != "memfit" || r.Variant != "approx-act+ms-norm" || len(r.Losses) != 2 || r.Unit != "tokens/s" || r.PerSecond <= 0 {
		t.Errorf("result %+v", r)
	}
	for _, f := range []string{spec.InitFile, prof} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
}

// TestBenchCPUUsage: wrong calls of `bench cpu` are usage errors (exit 2), before anything runs.
func TestBenchCPUUsage(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "cpu", "--cases", "x", "--llama-tiny", "../pretrained/llama-tiny"},
		{"bench", "cpu", "--variants", "approx-act", "--llama-tiny", "../pretrained/llama-tiny"},
		{"bench", "cpu", "--variants", "plain,nonsense", "--llama-tiny", "../pretrained/llama-tiny"},
		{"bench", "cpu", "--warmup", "0", "--llama-tiny", "../pretrained/llama-tiny"},
		{"bench", "cpu", "--llama-tiny", "/nonexistent"},
		{"bench", "cpu", "--cases", "d", "--llama-tiny", "../pretrained/llama-tiny", "--roberta-tiny", "/nonexistent"},
		{"bench", "cpu", "step", "--spec", "/nonexistent.json", "--json", "x.json"},
	} {
		args = append(args, "--work-dir", t.TempDir(), "--out", t.TempDir())
		if args[2] == "step" {
			args = args[:len(args)-4]
		}
		if _, errOut, code := run(t, args...); code != 2 {
			t.Errorf("%v: exit %d (%s)", args, code, errOut)
		}
	}
}
