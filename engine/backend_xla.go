//go:build xla

package engine

import (
	"fmt"
	"os"
	"strings"

	"github.com/gomlx/compute"
	"github.com/gomlx/go-xla/compute/xla"
)

// XLALinked reports whether this binary was built with the XLA backend (build tag "xla").
const XLALinked = true

// PreallocateEnv, set to 1 or true, makes the CUDA plugin reserve most of the GPU's memory when the client
// starts (go-xla's backend option preallocate=true, with its memory_fraction, 0.75 unless given). memfit, like
// go-xla since v0.3, leaves that preallocation off so that the device's peak bytes in use
// (memory.XLADeviceStats) measure what the work needed, not the pool.
const PreallocateEnv = "MEMFIT_XLA_PREALLOCATE"

func init() {
	// Never let go-xla download a plugin from the internet. In go-xla v0.4.13 (not yet in v0.4.1, which
	// linked its installer) the downloader is only linked when a program imports go-xla's
	// compute/xla/autoinstall, which memfit does not; both switches stay as a second guard.
	_ = os.Setenv(xla.NoAutoInstallEnv, "1")
	xla.EnableAutoInstall(false)
}

func newXLABackend(plugin, options string) (backend compute.Backend, err error) {
	path, err := findPlugin(plugin)
	if err != nil {
		return nil, err
	}
	name := plugin
	if options != "" {
		name += "," + options
	}
	defer func() {
		if r := recover(); r != nil {
			backend, err = nil, fmt.Errorf("backend xla:%s: %v", name, r)
		}
	}()
	var preloadErr error
	cuda := IsCUDAPlugin(path)
	if cuda {
		inst := CUDAInstallFor(path)
		// go-xla's CUDA check (pjrt/cuda_linux.go, the same in v0.4.1 and v0.4.13) looks for the NVIDIA
		// libraries in <plugin folder>/../nvidia, go-xla's own install layout: for JAX's layout
		// (site-packages/jax_plugins/xla_cudaN/) it finds none and only logs a warning; where it finds one it
		// sets --xla_gpu_cuda_data_dir to that nvidia folder, not to the nvidia/cuda_nvcc folder that holds
		// ptxas and libdevice. (go-xla v0.1.4 set it to a folder hard-coded in its source; fixed in v0.2.1.)
		// memfit turns the check off (GOPJRT_CUDA_CHECKS=0, unless set) and points XLA at the install's CUDA
		// data folder itself, as JAX does.
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
	}
	// An absolute path is loaded directly by go-xla, without any search or download; the options follow it.
	b, err := xla.NewWithOptions(xlaConfig(path, options, cuda, os.Getenv(PreallocateEnv)), nil)
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", " ")
		if preloadErr != nil {
			msg += "; " + preloadErr.Error()
		}
		return nil, fmt.Errorf("backend xla:%s: %s", name, msg)
	}
	return b, nil
}

// XLAAvailable reports whether this binary was built with the XLA/PJRT backend (the xla build tag).
func XLAAvailable() bool { return true }
