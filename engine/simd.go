package engine

import (
	"os"
	"runtime"
	"strings"

	"github.com/gomlx/compute/support/envutil"
)

// SIMD reports which vector matmul kernels GoMLX's pure-Go backend uses in this binary on this CPU: "avx512",
// "avx2", or "" when it runs its plain Go kernels.
//
// The kernels exist only in amd64 builds made with GOEXPERIMENT=simd (Go's SIMD experiment): a build
// without it is about 15x slower on matrix products. GOMLX_GO_SIMD_AVX512=0 and GOMLX_GO_SIMD_AVX2=0 turn them off, as
// in GoMLX.
func SIMD() string {
	if !simdBuild {
		return ""
	}
	if ok, err := envutil.ReadBool(envutil.GoBackendDotMatmul, true); err != nil || !ok {
		return ""
	}
	if cpuAVX512() && envBool(envutil.GoBackendSIMD_AVX512) {
		return "avx512"
	}
	if cpuAVX2() && envBool(envutil.GoBackendSIMD_AVX2) {
		return "avx2"
	}
	return ""
}

// SIMDBuild reports whether this binary was built with GOEXPERIMENT=simd.
func SIMDBuild() bool { return simdBuild }

// SIMDAdvice returns a one-line hint when this binary could run GoMLX's vector kernels but does not: an amd64
// build without GOEXPERIMENT=simd. It returns "" otherwise (a SIMD build, or another architecture, where GoMLX
// has no vector kernels).
func SIMDAdvice() string {
	if runtime.GOARCH != "amd64" || simdBuild {
		return ""
	}
	return "note: this binary was built without GOEXPERIMENT=simd, so matrix products run about 15x slower; " +
		"rebuild with GOEXPERIMENT=simd (e.g. GOEXPERIMENT=simd go run ./cmd/finetune ...)"
}

// envBool reads a GoMLX boolean switch that defaults to true; a malformed value counts as off.
func envBool(name string) bool {
	ok, err := envutil.ReadBool(name, true)
	return err == nil && ok
}

// godebugHas reports whether $GODEBUG contains the setting key=value.
func godebugHas(key, value string) bool {
	for _, kv := range strings.Split(os.Getenv("GODEBUG"), ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && k == key && v == value {
			return true
		}
	}
	return false
}
