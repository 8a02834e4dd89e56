package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/engine"
)

// fakeJAX lays out a JAX CUDA install (two plugin generations, two NVIDIA components and the nvcc data folder)
// under a site-packages folder and returns it. The "plugins" are not loadable libraries.
func fakeJAX(t *testing.T) string {
	site := filepath.Join(t.TempDir(), "lib", "python3.12", "site-packages")
	for _, f := range []string{
		"jax_plugins/xla_cuda12/xla_cuda_plugin.so",
		"jax_plugins/xla_cuda13/xla_cuda_plugin.so",
		"nvidia/cublas/lib/libcublas.so.13",
		"nvidia/cuda_runtime/lib/libcudart.so.13",
		"nvidia/cuda_nvcc/bin/ptxas",
	} {
		p := filepath.Join(site, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("not a library"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return site
}

// TestFindJAXCUDA: the newest CUDA plugin of a JAX install is found through MEMFIT_PYTHON_SITE, with the
// NVIDIA library folders and the CUDA data folder beside it.
func TestFindJAXCUDA(t *testing.T) {
	site := fakeJAX(t)
	t.Setenv(engine.PythonSiteEnv, site)
	inst, err := engine.FindJAXCUDA()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(site, "jax_plugins/xla_cuda13/xla_cuda_plugin.so"); inst.Plugin != want {
		t.Errorf("plugin %s, want %s", inst.Plugin, want)
	}
	want := []string{filepath.Join(site, "nvidia/cublas/lib"), filepath.Join(site, "nvidia/cuda_runtime/lib")}
	if strings.Join(inst.LibDirs, ":") != strings.Join(want, ":") {
		t.Errorf("library folders %v, want %v", inst.LibDirs, want)
	}
	if inst.DataDir != filepath.Join(site, "nvidia/cuda_nvcc") {
		t.Errorf("data folder %q", inst.DataDir)
	}
	if !engine.IsCUDAPlugin(inst.Plugin) || engine.IsCUDAPlugin("/x/pjrt_c_api_cpu_plugin.so") {
		t.Error("IsCUDAPlugin is wrong")
	}
	// XLA_FLAGS: the data folder is added unless the user set one.
	if got := engine.CUDAXLAFlags("--xla_dump_to=/tmp/d", inst); got != "--xla_dump_to=/tmp/d --xla_gpu_cuda_data_dir="+inst.DataDir {
		t.Errorf("XLA_FLAGS %q", got)
	}
	if got := engine.CUDAXLAFlags("--xla_gpu_cuda_data_dir=/mine", inst); got != "--xla_gpu_cuda_data_dir=/mine" {
		t.Errorf("a user's --xla_gpu_cuda_data_dir was replaced: %q", got)
	}
}

// TestCUDAPluginFromJAX: --backend xla:cuda resolves to the JAX plugin when no pjrt_c_api_cuda_plugin.so is on
// the PJRT search path; loading it (a fake here) fails with one line, not a panic.
func TestCUDAPluginFromJAX(t *testing.T) {
	site := fakeJAX(t)
	empty := t.TempDir()
	t.Setenv(engine.PythonSiteEnv, site)
	t.Setenv("PJRT_PLUGIN_LIBRARY_PATH", empty)
	t.Setenv("LD_LIBRARY_PATH", "")
	t.Setenv("XLA_FLAGS", "")
	_, err := engine.NewBackend("xla:cuda")
	if err == nil {
		t.Fatal("a fake plugin loaded")
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || strings.Contains(msg, "not found") {
		t.Errorf("want a one-line load (or no-XLA-build) error for a found plugin, got %q", msg)
	}
	if engine.XLAAvailable() && !strings.Contains(msg, "xla_cuda13") {
		t.Errorf("the error does not name the plugin it tried: %q", msg)
	}
}
