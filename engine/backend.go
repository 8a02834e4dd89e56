package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/gobackend"
)

// BackendEnv is the environment variable that selects the backend when no explicit choice is given.
const BackendEnv = "MEMFIT_BACKEND"

// DefaultBackend is the backend spec used when neither a flag nor MEMFIT_BACKEND chooses one: the pure-Go
// backend, which NewBackend configures with sequential op scheduling in creation order (see GoOptions).
const DefaultBackend = "go"

// GoOptions are the options NewBackend adds to the pure-Go backend unless the spec sets them otherwise:
//
//   - ops_sequential: GoMLX's parallel op scheduler still deadlocks on training graphs in v0.28.2 with its
//     default worker pool (every worker runs an op whose matmul then waits in Saturate for a free worker; seen
//     on the scaled LLaMA LoRA step of the CPU grid). With an unlimited pool (parallelism=-1) it did not
//     deadlock and was faster, because elementwise ops are single-threaded in the Go backend and two could run
//     at once (the CPU grid's scaled ViT full step 2.17 -> 1.67 s, its LLaMA LoRA step 0.84 -> 0.65 s on the
//     2-core VM), but it runs ops in the order they become ready, and the measured peak (tools/peakmem's pool
//     counter) rose from 232 to 317-361 MiB on that ViT step and from 158 to 293 MiB with approx-act + ms-norm,
//     from 57 to 123 MiB on the LLaMA step with approx-act + ms-norm: the memory saving was gone. Matrix
//     products stay multi-threaded inside either way. Measured again on v0.28.16 (docs/simd.md): no deadlock
//     seen, but slower and higher (the CPU comparison's ViT step 0.40 -> 0.56 s, its measured peak with
//     approx-act + ms-norm 237 -> 321 MiB).
//   - creation_order: run the ops in the order the graph built them (forward, then backward layer by layer),
//     as GoMLX v0.26 did. v0.28's default order (longest path to an output first) postpones every weight
//     gradient to the end and keeps its inputs alive until then: on the scaled ViT step the simulated peak
//     rose from 262 to 310 MiB (plain) and from 172 to 273 MiB (approx-act + ms-norm), which all but erases the
//     memory saving (0.66x plain becomes 0.88x).
const GoOptions = "ops_sequential,creation_order"

// Spec is a parsed backend choice.
type Spec struct {
	// Name is "go" or "xla".
	Name string
	// Options are the backend's comma-separated options: for the pure-Go backend GoMLX's Go backend options
	// (GoOptions are added unless the spec sets the op execution or the schedule itself); for XLA go-xla's
	// backend options after the plugin (e.g. "tf32=false", "allocator=cuda_async", "memory_fraction=0.5"; see
	// go-xla's compute/xla package documentation, or run with --backend xla:cuda,help).
	Options string
	// Plugin is the XLA PJRT plugin: a name such as "cuda" (searched as pjrt_c_api_<name>_plugin.so, and for
	// "cuda" then in a JAX CUDA install, see FindJAXCUDA) or an absolute path to the plugin's .so file.
	Plugin string
}

// String returns the canonical spec text.
func (s Spec) String() string {
	switch s.Name {
	case "go":
		if s.Options == "" {
			return "go"
		}
		return "go:" + s.Options
	case "xla":
		if s.Options == "" {
			return "xla:" + s.Plugin
		}
		return "xla:" + s.Plugin + "," + s.Options
	}
	return s.Name
}

// ParseSpec parses a backend spec: "go", "go:<Go backend options>", "xla:<plugin name>" or "xla:<absolute path to
// plugin .so>", the XLA ones optionally followed by go-xla's backend options after commas
// ("xla:cuda,tf32=false"). An empty spec means DefaultBackend.
func ParseSpec(spec string) (Spec, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		spec = DefaultBackend
	}
	name, rest, _ := strings.Cut(spec, ":")
	switch name {
	case "go", "simplego": // "simplego": the name of GoMLX's Go backend before v0.28
		return Spec{Name: "go", Options: rest}, nil
	case "xla":
		plugin, opts, _ := strings.Cut(rest, ",")
		if plugin == "" {
			return Spec{}, fmt.Errorf("backend %q: name the XLA plugin, e.g. xla:cuda or xla:/abs/path/pjrt_c_api_cuda_plugin.so", spec)
		}
		if strings.HasPrefix(plugin, "~") || (strings.ContainsRune(plugin, '/') && !filepath.IsAbs(plugin)) {
			return Spec{}, fmt.Errorf("backend %q: an XLA plugin path must be absolute", spec)
		}
		return Spec{Name: "xla", Plugin: plugin, Options: strings.Trim(opts, ",")}, nil
	}
	return Spec{}, fmt.Errorf("unknown backend %q: use \"go\" (pure Go, the default) or \"xla:<plugin name or absolute .so path>\"", spec)
}

// ChooseSpec returns flag if it is not empty, else $MEMFIT_BACKEND, else DefaultBackend.
func ChooseSpec(flag string) string {
	if flag != "" {
		return flag
	}
	if env := os.Getenv(BackendEnv); env != "" {
		return env
	}
	return DefaultBackend
}

// NewBackend creates the backend named by spec (see ParseSpec). It never downloads anything: an XLA plugin that
// cannot be found is an error that says where memfit looked and how to point at one.
func NewBackend(spec string) (compute.Backend, error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	switch s.Name {
	case "go":
		opts := s.Options
		if !strings.Contains(opts, "ops_parallel") && !strings.Contains(opts, "ops_sequential") {
			opts = strings.Trim(opts+",ops_sequential", ",")
		}
		if !strings.Contains(opts, "dependency_order") && !strings.Contains(opts, "creation_order") {
			opts = strings.Trim(opts+",creation_order", ",")
		}
		b, err := gobackend.New(opts)
		if err != nil {
			return nil, fmt.Errorf("backend %q: %w", s, err)
		}
		return b, nil
	case "xla":
		return newXLABackend(s.Plugin, s.Options)
	}
	return nil, fmt.Errorf("unknown backend %q", spec)
}

// pluginDir is a folder a plugin given by name is looked for in, and why.
type pluginDir struct{ dir, source string }

// pluginSearchDirs lists where a plugin given by name is looked for, in order: go-xla's own search path
// (PJRT_PLUGIN_LIBRARY_PATH, LD_LIBRARY_PATH) and the folders go-xla's installer (go run
// github.com/gomlx/go-xla/cmd/pjrt_installer) writes to: <lib>/go-xla, and <lib>/go-xla/nvidia where v0.4 puts
// the CUDA plugin beside the NVIDIA libraries, for <lib> ~/.local/lib (its default) and /usr/local/lib, and the
// older gomlx/pjrt folders.
func pluginSearchDirs() []pluginDir {
	var dirs []pluginDir
	for _, env := range []string{"PJRT_PLUGIN_LIBRARY_PATH", "LD_LIBRARY_PATH"} {
		for _, d := range filepath.SplitList(os.Getenv(env)) {
			if d != "" {
				dirs = append(dirs, pluginDir{d, "$" + env})
			}
		}
	}
	var libs []string
	if home, err := os.UserHomeDir(); err == nil {
		libs = append(libs, filepath.Join(home, ".local", "lib"))
	}
	libs = append(libs, "/usr/local/lib")
	for _, lib := range libs {
		installer := "go-xla's installer (" + filepath.Join(lib, "go-xla") + ")"
		dirs = append(dirs, pluginDir{filepath.Join(lib, "go-xla"), installer}, pluginDir{filepath.Join(lib, "go-xla", "nvidia"), installer},
			pluginDir{filepath.Join(lib, "gomlx", "pjrt"), "gopjrt's installer (" + filepath.Join(lib, "gomlx", "pjrt") + ")"})
	}
	return dirs
}

// Plugin is the XLA PJRT plugin a --backend xla:NAME would load, and where it was found.
type Plugin struct {
	// Name is what was asked for ("cuda", or an absolute path).
	Name string
	// Path is the plugin's .so file.
	Path string
	// Source says how it was found: an absolute path given, a search folder ($PJRT_PLUGIN_LIBRARY_PATH,
	// $LD_LIBRARY_PATH, go-xla's installer), or JAX's pip wheel.
	Source string
}

// FindPlugin resolves a plugin name (searched as pjrt_c_api_<name>_plugin.so in pluginSearchDirs' folders, and
// for "cuda" then in a JAX CUDA install: FindJAXCUDA) or an absolute path to an existing file, without loading
// it. The error says where memfit looked and how to install one; memfit never downloads plugins.
func FindPlugin(plugin string) (Plugin, error) {
	if filepath.IsAbs(plugin) {
		if st, err := os.Stat(plugin); err != nil || st.IsDir() {
			return Plugin{}, fmt.Errorf("XLA plugin %s not found: pass the absolute path of an existing pjrt_c_api_<name>_plugin.so (for CUDA, xla_cuda_plugin.so from the jax-cuda plugin wheel)", plugin)
		}
		return Plugin{Name: plugin, Path: plugin, Source: "the path given"}, nil
	}
	file := "pjrt_c_api_" + plugin + "_plugin.so"
	dirs := pluginSearchDirs()
	var looked []string
	for _, d := range dirs {
		p := filepath.Join(d.dir, file)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return Plugin{Name: plugin, Path: p, Source: d.source}, nil
		}
		looked = append(looked, d.dir)
	}
	if plugin == "cuda" {
		inst, err := FindJAXCUDA()
		if err == nil {
			return Plugin{Name: plugin, Path: inst.Plugin, Source: "JAX's CUDA plugin wheel (pip install \"jax[cuda13]\")"}, nil
		}
		return Plugin{}, fmt.Errorf("XLA plugin %q not found (looked for %s in %s, and %v): install JAX's CUDA plugin (pip install \"jax[cuda13]\") or go-xla's (go run github.com/gomlx/go-xla/cmd/pjrt_installer@latest -autoinstall), set PJRT_PLUGIN_LIBRARY_PATH to a plugin's folder or use --backend xla:/abs/path/to/plugin.so; memfit never downloads plugins",
			plugin, file, strings.Join(looked, ", "), err)
	}
	return Plugin{}, fmt.Errorf("XLA plugin %q not found (looked for %s in %s): set PJRT_PLUGIN_LIBRARY_PATH to its folder or use --backend xla:/abs/path/to/plugin.so; memfit never downloads plugins",
		plugin, file, strings.Join(looked, ", "))
}

// findPlugin resolves a plugin name or absolute path to an existing file (FindPlugin).
func findPlugin(plugin string) (string, error) {
	p, err := FindPlugin(plugin)
	return p.Path, err
}
