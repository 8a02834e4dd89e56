package cli_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/memfit/memfit/cli"
	"github.com/memfit/memfit/engine"
)

func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = cli.Main(args, &out, &errb)
	return out.String(), errb.String(), code
}

// TestBenchBlocks runs the benchmark command at a tiny size and checks the table it prints.
func TestBenchBlocks(t *testing.T) {
	out, errOut, code := run(t, "bench", "blocks", "--layers", "1", "--batch-size", "1", "--seq-len", "9", "--hidden", "32",
		"--mlp", "128", "--heads", "2", "--steps", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"GELU+LN", "ReGELU2+LN", "GELU+MS-LN", "ReGELU2+MS-LN", "saved: exact", "peak: estimate: liveness simulation"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "step 1/1") {
		t.Errorf("no progress lines on stderr: %q", errOut)
	}
	// Every row's saved bytes match the analytic count exactly at this size.
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "LN ") && !strings.Contains(line, "1.0000") {
			t.Errorf("saved/analytic is not 1.0000 in row %q", line)
		}
	}
}

// TestSIMDNote: `version` names the pure-Go matmul kernels, and a long command of an amd64 build without
// GOEXPERIMENT=simd ends with one line saying how to get them (and a SIMD build prints no such line).
func TestSIMDNote(t *testing.T) {
	out, errOut, code := run(t, "version")
	if code != 0 || !strings.Contains(out, "pure-Go matmul kernels: ") {
		t.Fatalf("version: exit %d, %q %q", code, out, errOut)
	}
	if kernels := engine.SIMD(); kernels != "" && !strings.Contains(out, "kernels: "+kernels) {
		t.Errorf("version does not name the %s kernels: %q", kernels, out)
	}
	_, errOut, code = run(t, "bench", "blocks", "--layers", "1", "--batch-size", "1", "--seq-len", "9", "--hidden", "32",
		"--mlp", "128", "--heads", "2", "--steps", "1", "--variants", "GELU+LN")
	if code != 0 {
		t.Fatalf("bench blocks: exit %d: %s", code, errOut)
	}
	want := runtime.GOARCH == "amd64" && !engine.SIMDBuild()
	if got := strings.Contains(errOut, "GOEXPERIMENT=simd"); got != want {
		t.Errorf("SIMD note printed = %v, want %v (GOARCH %s, SIMD build %v): %q", got, want, runtime.GOARCH, engine.SIMDBuild(), errOut)
	}
}

// TestBadInputIsOneLine: user errors print one line and exit 1.
func TestBadInputIsOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "blocks", "--variants", "GELU+BN"},
		{"bench", "blocks", "--hidden", "30", "--heads", "4"},
		{"--backend", "tpu", "bench", "blocks"},
		{"--backend", "xla:/nonexistent/plugin.so", "bench", "blocks"},
		{"approxbp", "fit", "--bits", "7"},
	} {
		_, errOut, code := run(t, args...)
		if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.HasPrefix(errOut, "finetune: ") {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and one line", args, code, errOut)
		}
	}
}

// TestApproxBPFit prints JSON coefficients that satisfy the constraints and, for 2 bits, the published ones.
func TestApproxBPFit(t *testing.T) {
	out, errOut, code := run(t, "approxbp", "fit", "--act", "silu", "--bits", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res struct {
		Name      string    `json:"name"`
		A         []float64 `json:"a"`
		C         []float64 `json:"c"`
		Objective float64   `json:"objective"`
		Published struct {
			Objective float64 `json:"objective"`
		} `json:"published"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if res.Name != "ReSiLU2" || len(res.A) != 3 || len(res.C) != 3 {
		t.Errorf("got %+v", res)
	}
	if !(res.Objective > 0 && res.Objective <= res.Published.Objective) {
		t.Errorf("fitted objective %g should be positive and not above the published %g", res.Objective, res.Published.Objective)
	}
}

func TestVersion(t *testing.T) {
	out, errOut, code := run(t, "version")
	if code != 0 || !strings.Contains(out, "GoMLX ") || !strings.Contains(out, "backends: go") || !strings.Contains(out, "\nGPU: ") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// The CUDA plugin --backend xla:cuda would load: here a fake JAX install found through MEMFIT_PYTHON_SITE
	// (engine's tests cover go-xla's installer layout and the search order); nothing is loaded.
	site := filepath.Join(t.TempDir(), "site-packages")
	plugin := filepath.Join(site, "jax_plugins", "xla_cuda13", "xla_cuda_plugin.so")
	for _, f := range []string{plugin, filepath.Join(site, "nvidia", "cublas", "lib", "libcublas.so.13")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("MEMFIT_PYTHON_SITE", site)
	t.Setenv("PJRT_PLUGIN_LIBRARY_PATH", t.TempDir())
	t.Setenv("LD_LIBRARY_PATH", "")
	t.Setenv("HOME", t.TempDir())
	out, _, _ = run(t, "version")
	if want := "XLA plugin for --backend xla:cuda: " + plugin + " (JAX's CUDA plugin wheel"; !strings.Contains(out, want) || !strings.Contains(out, "1 NVIDIA library folders beside it") {
		t.Errorf("version does not name the plugin it would load (%q):\n%s", want, out)
	}
	t.Setenv("MEMFIT_PYTHON_SITE", t.TempDir())
	if out, _, _ = run(t, "version"); !strings.Contains(out, "XLA plugin for --backend xla:cuda: none found (pip install") {
		t.Errorf("version without a plugin:\n%s", out)
	}
}
