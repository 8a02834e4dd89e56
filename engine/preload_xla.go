//go:build xla

package engine

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
static void* memfit_dlopen(const char* path) { return dlopen(path, RTLD_NOW | RTLD_GLOBAL); }
static const char* memfit_dlerror(void) { return dlerror(); }
*/
import "C"

import (
	"errors"
	"unsafe"
)

// PreloadLibraries loads the shared libraries files into the process with dlopen(RTLD_NOW | RTLD_GLOBAL), in
// rounds: a library whose dependencies are not loaded yet (and are not on the loader's search path) fails in one
// round and loads in a later one, once they are. Once a library is loaded, the dynamic loader resolves later
// dependencies on its soname from it, so the CUDA plugin finds the NVIDIA libraries of a JAX install without
// LD_LIBRARY_PATH (which the loader reads only when the process starts). It returns the files that never loaded
// and the last loader error about them. Builds with the xla tag only (it needs cgo).
func PreloadLibraries(files []string) (failed []string, err error) {
	pending := append([]string(nil), files...)
	var last string
	for len(pending) > 0 {
		var next []string
		for _, f := range pending {
			cs := C.CString(f)
			h := C.memfit_dlopen(cs)
			C.free(unsafe.Pointer(cs))
			if h == nil {
				if msg := C.memfit_dlerror(); msg != nil {
					last = C.GoString(msg)
				}
				next = append(next, f)
			}
		}
		if len(next) == len(pending) {
			break // no progress this round
		}
		pending = next
	}
	if len(pending) > 0 {
		return pending, errors.New(last)
	}
	return nil, nil
}
