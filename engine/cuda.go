package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// PythonSiteEnv lists (like PATH) extra Python site-packages folders searched for a JAX CUDA install, before the
// usual places (the active virtual or conda environment, the user's and the system's site-packages, /opt/*).
const PythonSiteEnv = "MEMFIT_PYTHON_SITE"

// CUDAInstall is an XLA CUDA PJRT plugin and the NVIDIA libraries installed beside it, as a JAX CUDA install
// lays them out: site-packages/jax_plugins/xla_cuda<N>/xla_cuda_plugin.so (the jax-cuda<N>-pjrt wheel) and
// site-packages/nvidia/<component>/lib (the nvidia-* wheels: cuBLAS, cuDNN, the CUDA runtime, ...).
type CUDAInstall struct {
	// Plugin is the plugin's .so file.
	Plugin string
	// LibDirs are the nvidia/*/lib folders (empty when the plugin is not inside a Python install).
	LibDirs []string
	// DataDir is the CUDA data folder XLA reads ptxas and libdevice from (nvidia/cuda_nvcc), or "".
	DataDir string
}

// pythonSiteDirs lists the site-packages folders searched for a JAX CUDA install, most specific first.
func pythonSiteDirs() []string {
	var dirs []string
	for _, d := range filepath.SplitList(os.Getenv(PythonSiteEnv)) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	for _, d := range filepath.SplitList(os.Getenv("PYTHONPATH")) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	var globs []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if p := os.Getenv(env); p != "" {
			globs = append(globs, filepath.Join(p, "lib", "python3*", "site-packages"))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		globs = append(globs, filepath.Join(home, ".local", "lib", "python3*", "site-packages"))
	}
	globs = append(globs, "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3/dist-packages", "/opt/*/lib/python3*/site-packages", "/opt/*/.venv/lib/python3*/site-packages",
		"/opt/conda/envs/*/lib/python3*/site-packages")
	for _, g := range globs {
		m, _ := filepath.Glob(g)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // python3.12 before python3.11
		dirs = append(dirs, m...)
	}
	return dirs
}

// FindJAXCUDA looks for a JAX CUDA install in the Python site-packages folders (see PythonSiteEnv) and returns
// the newest CUDA plugin found (xla_cuda13 before xla_cuda12) with its NVIDIA libraries. It only reads the file
// system; nothing is installed or downloaded.
func FindJAXCUDA() (CUDAInstall, error) {
	dirs := pythonSiteDirs()
	for _, site := range dirs {
		m, _ := filepath.Glob(filepath.Join(site, "jax_plugins", "xla_cuda*", "xla_cuda_plugin.so"))
		if len(m) == 0 {
			continue
		}
		sort.Slice(m, func(i, j int) bool { return cudaMajor(m[i]) > cudaMajor(m[j]) })
		return CUDAInstallFor(m[0]), nil
	}
	return CUDAInstall{}, fmt.Errorf("no JAX CUDA plugin (jax_plugins/xla_cuda*/xla_cuda_plugin.so) in %d Python site-packages folders (set %s to yours)",
		len(dirs), PythonSiteEnv)
}

// cudaMajor returns N of a .../xla_cudaN/... path (0 if none).
func cudaMajor(path string) int {
	n := 0
	fmt.Sscanf(strings.TrimPrefix(filepath.Base(filepath.Dir(path)), "xla_cuda"), "%d", &n)
	return n
}

// CUDAInstallFor returns the install of the CUDA plugin at path: for a plugin inside a JAX install, the
// nvidia/*/lib folders of the same site-packages and its nvidia/cuda_nvcc data folder; otherwise the ones in the
// nvidia folder next to the plugin's parent folder (go-xla's layout), if any.
func CUDAInstallFor(path string) CUDAInstall {
	inst := CUDAInstall{Plugin: path}
	for _, nv := range []string{
		filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(path))), "nvidia"), // site-packages/jax_plugins/xla_cudaN/x.so
		filepath.Join(filepath.Dir(filepath.Dir(path)), "nvidia"),               // <prefix>/lib/x.so -> <prefix>/nvidia
	} {
		libs, _ := filepath.Glob(filepath.Join(nv, "*", "lib"))
		if len(libs) == 0 {
			continue
		}
		sort.Strings(libs)
		inst.LibDirs = libs
		if st, err := os.Stat(filepath.Join(nv, "cuda_nvcc")); err == nil && st.IsDir() {
			inst.DataDir = filepath.Join(nv, "cuda_nvcc")
		}
		break
	}
	return inst
}

// IsCUDAPlugin reports whether a plugin name or path is an NVIDIA CUDA plugin.
func IsCUDAPlugin(plugin string) bool {
	return strings.Contains(strings.ToLower(filepath.Base(plugin)), "cuda")
}

// CUDAXLAFlags returns XLA_FLAGS with --xla_gpu_cuda_data_dir pointing at the install's data folder, unless the
// flags already set one or the install has none. go-xla's own CUDA check would otherwise set it to the nvidia
// folder beside its install layout (go-xla v0.1.4: to a folder hard-coded in its source), which is why
// newXLABackend also turns that check off.
func CUDAXLAFlags(flags string, inst CUDAInstall) string {
	if inst.DataDir == "" || strings.Contains(flags, "--xla_gpu_cuda_data_dir") {
		return flags
	}
	return strings.TrimSpace(flags + " --xla_gpu_cuda_data_dir=" + inst.DataDir)
}

// xlaConfig returns go-xla's backend configuration for the plugin at path: the path, then the backend options
// ("key=value" or "key", comma-separated; go-xla's compute/xla documents them). For a CUDA plugin, unless the
// options set preallocate themselves, memfit's choice goes first: preallocate=true when preallocateEnv (the
// value of MEMFIT_XLA_PREALLOCATE) is 1 or true, otherwise preallocate=false. go-xla (v0.3 to v0.4.13) already
// defaults to no preallocation for a plugin whose path names CUDA and overrides any preallocate passed as a
// client option, so the configuration string is the only way to turn it back on.
func xlaConfig(path, options string, cuda bool, preallocateEnv string) string {
	var parts []string
	if cuda && !hasXLAOption(options, "preallocate") {
		v := strings.ToLower(preallocateEnv)
		parts = append(parts, "preallocate="+strconv.FormatBool(v == "1" || v == "true"))
	}
	for _, o := range strings.Split(options, ",") {
		if o = strings.TrimSpace(o); o != "" {
			parts = append(parts, o)
		}
	}
	if len(parts) == 0 {
		return path
	}
	return path + "," + strings.Join(parts, ",")
}

// hasXLAOption reports whether go-xla backend options set the option name ("name", "name=...", or "noname"
// for a boolean).
func hasXLAOption(options, name string) bool {
	for _, o := range strings.Split(options, ",") {
		key, _, _ := strings.Cut(strings.TrimSpace(o), "=")
		if key == name || key == "no"+name {
			return true
		}
	}
	return false
}

// libraryFiles lists the shared libraries (*.so, *.so.N...) in dirs, sorted, without duplicates.
func libraryFiles(dirs []string) []string {
	var files []string
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if !e.IsDir() && strings.Contains(e.Name(), ".so") {
				files = append(files, filepath.Join(d, e.Name()))
			}
		}
	}
	sort.Strings(files)
	return slices.Compact(files)
}
