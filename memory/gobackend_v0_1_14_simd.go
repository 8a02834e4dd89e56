//go:build goexperiment.simd

package memory

import (
	"simd/archsimd"

	"github.com/gomlx/compute/support/envutil"
)

// goBackendBuild returns what this build of compute v0.1.14's Go backend registers, for the executor model in
// gobackend_v0_1_14.go. Built with GOEXPERIMENT=simd, the backend also registers its SIMD executors (unary,
// binary and reduce ops, FusedSoftmax, FusedLayerNorm) and, on amd64, the AVX-512 and AVX2 matrix kernels and
// reduce thresholds, each allowed when the CPU has the features and $GOMLX_GO_SIMD_AVX512 / $GOMLX_GO_SIMD_AVX2
// do not turn it off (internal/gobackend/simd_x86.go; archsimd reports no AVX off amd64).
func goBackendBuild() goBuild {
	return goBuild{
		simdExecutors: true,
		avx512:        envutil.MustReadBool(envutil.GoBackendSIMD_AVX512, true) && archsimd.X86.AVX512(),
		avx2:          envutil.MustReadBool(envutil.GoBackendSIMD_AVX2, true) && archsimd.X86.AVX2(),
	}
}
