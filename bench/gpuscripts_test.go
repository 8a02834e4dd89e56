package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGPUScripts checks, without a GPU, what a GPU session would otherwise find out the expensive way: the
// scripts of bench/gpu parse (bash -n, and shellcheck where it is installed) and verify.sh's Python helper reads
// memfit's metrics and JSON and compares figures as the script expects. `MEMFIT_VERIFY_BACKEND=go bash
// bench/gpu/verify.sh --quick` runs the whole script on the CPU (about 30 s on 2 cores).
func TestGPUScripts(t *testing.T) {
	scripts := []string{"gpu/verify.sh", "gpu/compare.sh", "gpu/memory_modes.sh", "gpu/plancheck.sh"}
	for _, s := range scripts {
		if out, err := exec.Command("bash", "-n", s).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v\n%s", s, err, out)
		}
	}
	if _, err := exec.LookPath("shellcheck"); err == nil {
		if out, err := exec.Command("shellcheck", scripts...).CombinedOutput(); err != nil {
			t.Errorf("shellcheck: %v\n%s", err, out)
		}
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	metrics := filepath.Join(dir, "metrics.jsonl")
	if err := os.WriteFile(metrics, []byte(`{"step":1,"loss":6.5,"grad_norm":0.25}
{"step":2,"loss":6.25,"grad_norm":0.5}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	compile := filepath.Join(dir, "compile.json")
	if err := os.WriteFile(compile, []byte(`{"compile": {"device_seconds": 1.5}, "variant": "plain"}
{"compile": {"device_seconds": 42.5}, "variant": "approx-act+ms-norm"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(wantOK bool, want string, args ...string) {
		t.Helper()
		out, err := exec.Command(py, append([]string{"gpu/verify_check.py"}, args...)...).Output()
		if (err == nil) != wantOK || strings.TrimSpace(string(out)) != want {
			t.Errorf("verify_check.py %v: %q, %v; want %q, ok %v", args, out, err, want, wantOK)
		}
	}
	check(true, "6.5 0.25 6.25 2 true", "steps", metrics)
	check(true, "42.5", "field", compile, "compile", "device_seconds")
	check(false, "", "field", compile, "compile", "nope")
	check(true, "5.00e-04", "close", "1.000", "0.9995", "1e-3")
	check(false, "2.00e-03", "close", "1.000", "0.998", "1e-3")
	check(false, "nan", "close", "nan", "1", "1")
	check(true, "", "flat", "1000000", "1020000", "0.02", "0")
	check(false, "", "flat", "1000000", "1030000", "0.02", "0")
	if err := os.WriteFile(metrics, []byte(`{"step":1,"loss":NaN,"grad_norm":0.25}`), 0o644); err != nil {
		t.Fatal(err)
	}
	check(true, "nan 0.25 nan 1 false", "steps", metrics)
}

// TestMemoryModesDryRun: bench/gpu/memory_modes.sh --dry-run prints the commands a GPU session runs for issue 35's
// memory-mode stage (`MEMMODES_BACKEND=go bash bench/gpu/memory_modes.sh DIR` runs them on the CPU with memfit's
// tiny presets, about 10 s; bench.TestReadMemoryModes checks the table they make).
func TestMemoryModesDryRun(t *testing.T) {
	cmd := exec.Command("bash", "gpu/memory_modes.sh", "--dry-run", t.TempDir())
	cmd.Env = append(os.Environ(), "MEMFIT_BIN=/bin/true", "MEMMODES_BACKEND=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	text := string(out)
	for _, want := range []string{
		// compile only, ties on, whole models: every mode of the issue, the pure-Go plan beside
		"env MEMFIT_XLA_TIES=1 /bin/true --backend xla:cuda memory --model llama-1b --variants plain\\,approx-act\\,approx-act+mesa\\,grad-ckpt\\,approx-act+ms-norm --beside go --json --method lora --lora-targets all-linear --batch-size 2 --seq-len 512 --compute-dtype float32 > ",
		"compile__llama-1b__lora__ties1.json",
		"--model vit-b16 --variants plain\\,approx-act\\,ms-norm\\,approx-act+ms-norm --beside go --json --num-labels 10 --method lora --lora-targets q\\,v --batch-size 64 --compute-dtype bfloat16 --attention flash",
		"--model llama-7b --variants plain\\,approx-act+ms-norm --beside go --json --method qlora --lora-targets all-linear --batch-size 4 --seq-len 512 --compute-dtype bfloat16 --attention flash",
		// real steps
		"bench step --model llama-1b --method lora-all --variant grad-ckpt --steps 5",
		"bench step --model vit-b16 --method lora-all --variant approx-act+ms-norm --steps 5",
		// the before/after on cut models
		"env MEMFIT_XLA_TIES=0 /bin/true --backend xla:cuda memory --model ",
		"compile__llama-7b__qlora__ties0__L2.json", "compile__llama-1b__lora__ties1__L4.json",
		// PyTorch + PEFT
		"peft_compare.py --steps 5 --json",
		"pytorch__llama-1b__lora__plain.json --model llama-1b --method lora-all --dtype float32 --batch 2 --seq 512",
		"pytorch__llama-7b__lora-bf16-for-qlora__plain.json --model llama-7b --method lora-all --batch 4 --seq 512",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("dry run lacks %q:\n%s", want, text)
		}
	}
}
