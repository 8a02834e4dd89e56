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

// TestFindPluginWhereInstallersPutIt: --backend xla:cuda finds the CUDA plugin where go-xla's installer writes it
// (~/.local/lib/go-xla/nvidia/pjrt_c_api_cuda_plugin.so in v0.4, beside the NVIDIA libraries; <lib>/go-xla in
// older ones), where pip puts JAX's (site-packages/jax_plugins/xla_cuda13), and on PJRT_PLUGIN_LIBRARY_PATH, in
// that order of preference after the environment; each says where it came from. Nothing is loaded.
func TestFindPluginWhereInstallersPutIt(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("PJRT_PLUGIN_LIBRARY_PATH", "")
	t.Setenv("LD_LIBRARY_PATH", "")
	t.Setenv("VIRTUAL_ENV", "")
	t.Setenv("CONDA_PREFIX", "")
	t.Setenv("PYTHONPATH", "")
	site := fakeJAX(t)
	t.Setenv(engine.PythonSiteEnv, site)
	p, err := engine.FindPlugin("cuda")
	if err != nil || p.Path != filepath.Join(site, "jax_plugins/xla_cuda13/xla_cuda_plugin.so") || !strings.Contains(p.Source, "JAX") {
		t.Fatalf("pip's JAX plugin: %+v, %v", p, err)
	}
	// go-xla's installer (v0.4.13 installer.CudaInstall): <lib>/go-xla/nvidia/pjrt_c_api_cuda_plugin.so, with the
	// NVIDIA libraries and cuda_nvcc beside it.
	nv := filepath.Join(home, ".local", "lib", "go-xla", "nvidia")
	for _, f := range []string{"pjrt_c_api_cuda_plugin.so", "cublas/lib/libcublas.so.13", "cuda_nvcc/bin/ptxas"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(nv, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(nv, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err = engine.FindPlugin("cuda")
	if err != nil || p.Path != filepath.Join(nv, "pjrt_c_api_cuda_plugin.so") || !strings.Contains(p.Source, "go-xla's installer") {
		t.Fatalf("go-xla's installer layout: %+v, %v", p, err)
	}
	inst := engine.CUDAInstallFor(p.Path)
	if len(inst.LibDirs) != 1 || inst.LibDirs[0] != filepath.Join(nv, "cublas", "lib") || inst.DataDir != filepath.Join(nv, "cuda_nvcc") {
		t.Errorf("go-xla's layout: NVIDIA libraries %v, data folder %q", inst.LibDirs, inst.DataDir)
	}
	// PJRT_PLUGIN_LIBRARY_PATH comes first.
	env := t.TempDir()
	if err := os.WriteFile(filepath.Join(env, "pjrt_c_api_cuda_plugin.so"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PJRT_PLUGIN_LIBRARY_PATH", env)
	if p, err = engine.FindPlugin("cuda"); err != nil || p.Path != filepath.Join(env, "pjrt_c_api_cuda_plugin.so") || p.Source != "$PJRT_PLUGIN_LIBRARY_PATH" {
		t.Errorf("PJRT_PLUGIN_LIBRARY_PATH: %+v, %v", p, err)
	}
	// Nothing anywhere: one line naming both installers.
	t.Setenv("PJRT_PLUGIN_LIBRARY_PATH", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv(engine.PythonSiteEnv, t.TempDir())
	if _, err = engine.FindPlugin("cuda"); err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "pjrt_installer") ||
		!strings.Contains(err.Error(), "jax[cuda13]") {
		t.Errorf("no plugin: %v", err)
	}
}

// TestNVIDIAGPUs: the GPUs are read from the driver's /proc files (a fake tree here), without loading anything.
func TestNVIDIAGPUs(t *testing.T) {
	root := t.TempDir()
	defer engine.SetProcRoot(root)()
	for i, model := range []string{"NVIDIA H100 80GB HBM3", "NVIDIA H200"} {
		bus := []string{"0000:19:00.0", "0000:3b:00.0"}[i]
		dir := filepath.Join(root, "driver", "nvidia", "gpus", bus)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		info := "Model: \t\t " + model + "\nIRQ:   \t\t 42\nGPU UUID: \t GPU-1234\nBus Location: \t " + bus + "\n"
		if err := os.WriteFile(filepath.Join(dir, "information"), []byte(info), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gpus, source := engine.NVIDIAGPUs()
	if len(gpus) != 2 || gpus[0] != "NVIDIA H100 80GB HBM3 (0000:19:00.0)" || gpus[1] != "NVIDIA H200 (0000:3b:00.0)" || !strings.HasSuffix(source, "driver/nvidia/gpus") {
		t.Errorf("GPUs %q from %q", gpus, source)
	}
	defer engine.SetProcRoot(t.TempDir())()
	t.Setenv("PATH", t.TempDir()) // no nvidia-smi either
	if gpus, source := engine.NVIDIAGPUs(); gpus != nil || source != "" {
		t.Errorf("no driver: %q from %q", gpus, source)
	}
}
