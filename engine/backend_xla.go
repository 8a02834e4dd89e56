//go:build xla

package engine

import (
	"fmt"
	"os"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/go-xla/compute/xla"
	"github.com/gomlx/go-xla/pjrt"
)

// XLALinked reports whether this binary was built with the XLA backend (build tag "xla").
const XLALinked = true

// PreallocateEnv, set to 1 or true, keeps the CUDA plugin's default of reserving most of the GPU's memory when
// the client starts. memfit turns that preallocation off by default so that the device's peak bytes in use
// (memory.XLADeviceStats) measure what the work needed, not the pool.
const PreallocateEnv = "MEMFIT_XLA_PREALLOCATE"

func init() {
	// Never let go-xla download a plugin from the internet.
	_ = os.Setenv(xla.NoAutoInstallEnv, "1")
	xla.EnableAutoInstall(false)
}

func newXLABackend(plugin string) (backend compute.Backend, err error) {
	path, err := findPlugin(plugin)
	if err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			backend, err = nil, fmt.Errorf("backend xla:%s: %v", plugin, r)
		}
	}()
	var opts pjrt.NamedValuesMap
	var preloadErr error
	if IsCUDAPlugin(path) {
		inst := CUDAInstallFor(path)
		// go-xla v0.1.4's CUDA check set XLA_FLAGS=--xla_gpu_cuda_data_dir to a folder hard-coded in its source
		// (a developer's home); v0.4.1 has no such check, and GOPJRT_CUDA_CHECKS=0 is kept for older builds only.
		// Point XLA at the install's own CUDA data folder.
		if os.Getenv("GOPJRT_CUDA_CHECKS") == "" {
			_ = os.Setenv("GOPJRT_CUDA_CHECKS", "0")
		}
		if flags := CUDAXLAFlags(os.Getenv("XLA_FLAGS"), inst); flags != "" {
			_ = os.Setenv("XLA_FLAGS", flags)
		}
		// The NVIDIA libraries of a JAX install sit in nvidia/*/lib, which the loader does not search.
		if failed, err := PreloadLibraries(libraryFiles(inst.LibDirs)); err != nil {
			preloadErr = fmt.Errorf("%d NVIDIA libraries of %s did not load (%v)", len(failed), strings.Join(inst.LibDirs, ":"), err)
		}
		if v := strings.ToLower(os.Getenv(PreallocateEnv)); v != "1" && v != "true" {
			opts = pjrt.NamedValuesMap{"preallocate": false}
		}
	}
	// An absolute path is loaded directly by go-xla, without any search or download.
	b, err := xla.NewWithOptions(path, opts)
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", " ")
		if preloadErr != nil {
			msg += "; " + preloadErr.Error()
		}
		return nil, fmt.Errorf("backend xla:%s: %s", plugin, msg)
	}
	return b, nil
}

// XLAAvailable reports whether this binary was built with the XLA/PJRT backend (the xla build tag).
func XLAAvailable() bool { return true }
