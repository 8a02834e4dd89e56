package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/engine"
)

// simdStatus says which matmul kernels the pure-Go backend runs in this binary, and how to get the vector ones.
func simdStatus() string {
	switch k := engine.SIMD(); {
	case k != "":
		s := k + " (built with GOEXPERIMENT=simd)"
		if engine.FMAWorkaround() {
			s += "; GODEBUG=cpu.fma=off is not set in this process, so math.Exp runs about 100x slower after the vector kernels (finetune sets it itself by restarting; library users set it)"
		}
		return s
	case engine.SIMDBuild():
		return "plain Go (built with GOEXPERIMENT=simd, but this CPU has neither AVX-512 nor AVX2, or GOMLX_GO_SIMD_AVX512/GOMLX_GO_SIMD_AVX2 turn them off)"
	case runtime.GOARCH == "amd64":
		return "plain Go: built without GOEXPERIMENT=simd, so matrix products run about 15x slower; rebuild with GOEXPERIMENT=simd"
	}
	return "plain Go (GoMLX has vector kernels on amd64 only)"
}

// cudaPluginStatus says which CUDA PJRT plugin --backend xla:cuda would load and where it was found (nothing is
// loaded), or that there is none and how to get one.
func cudaPluginStatus() string {
	p, err := engine.FindPlugin("cuda")
	if err != nil {
		return `none found (pip install "jax[cuda13]", or go run github.com/gomlx/go-xla/cmd/pjrt_installer@latest -autoinstall; docs/gpu.md)`
	}
	s := p.Path + " (" + p.Source
	if inst := engine.CUDAInstallFor(p.Path); len(inst.LibDirs) > 0 {
		s += fmt.Sprintf("; %d NVIDIA library folders beside it", len(inst.LibDirs))
	}
	s += ")"
	if !engine.XLAAvailable() {
		s += "; this binary cannot load it: rebuild with -tags xla"
	}
	return s
}

// gpuStatus names the NVIDIA GPUs the driver lists (engine.NVIDIAGPUs), the one --backend xla:cuda runs on first.
func gpuStatus() string {
	gpus, source := engine.NVIDIAGPUs()
	switch len(gpus) {
	case 0:
		return "no NVIDIA GPU found (no /proc/driver/nvidia/gpus, no nvidia-smi): --backend xla:cuda has nothing to run on"
	case 1:
		return gpus[0] + " (from " + source + ")"
	}
	return fmt.Sprintf("%s, and %d more (from %s; memfit runs on the first)", gpus[0], len(gpus)-1, source)
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print memfit's version, its GoMLX version and the backends this binary can use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			version, gomlx, goxla := "(devel)", "?", ""
			if info, ok := debug.ReadBuildInfo(); ok {
				version = moduleVersion(info)
				for _, dep := range info.Deps {
					switch dep.Path {
					case "github.com/gomlx/gomlx":
						gomlx = dep.Version
					case "github.com/gomlx/go-xla":
						goxla = dep.Version
					}
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "memfit %s\nGoMLX %s\n%s %s/%s\n", version, gomlx, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			backends := "go (pure Go, default)"
			if engine.XLAAvailable() {
				backends += ", xla (go-xla " + goxla + "; --backend xla:cuda finds a PJRT CUDA plugin or JAX's, xla:/abs/plugin.so loads one)"
			} else {
				backends += "; xla not built in (rebuild with -tags xla)"
			}
			fmt.Fprintf(out, "backends: %s\n", backends)
			fmt.Fprintf(out, "XLA plugin for --backend xla:cuda: %s\n", cudaPluginStatus())
			fmt.Fprintf(out, "GPU: %s\n", gpuStatus())
			fmt.Fprintf(out, "pure-Go matmul kernels: %s\n", simdStatus())
			return nil
		},
	}
}

// moduleVersion names the memfit a binary was built from: the module version of a `go install
// github.com/memfit/memfit/cmd/finetune@v0.4.0` (or the pseudo-version go stamps from a git checkout, with
// +dirty for uncommitted changes), else, for a build without a module version ("(devel)": `go build
// -buildvcs=false`, or `go run`), the commit it records, or "(devel)" when it records none.
func moduleVersion(info *debug.BuildInfo) string {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, when string
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "(devel: built from a source tree without version information; go install github.com/memfit/memfit/cmd/finetune@VERSION names its version)"
	}
	v := "(devel) commit " + rev[:min(12, len(rev))]
	if when != "" {
		v += " of " + when
	}
	if modified {
		v += ", with uncommitted changes"
	}
	return v
}
