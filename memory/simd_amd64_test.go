//go:build amd64 && goexperiment.simd

package memory

import (
	"simd/archsimd"

	"github.com/gomlx/compute/support/envutil"
)

// wantFloat32DotImpl is the DotGeneral implementation the Go backend registers for float32 (and bfloat16) in
// this build: with GOEXPERIMENT=simd on amd64, AVX-512 or AVX2 when the CPU has them and they are not turned off
// (dot/matmul/avx512.go, avx2.go).
func wantFloat32DotImpl() string {
	switch {
	case envutil.MustReadBool(envutil.GoBackendSIMD_AVX512, true) && archsimd.X86.AVX512():
		return "simd:avx512"
	case envutil.MustReadBool(envutil.GoBackendSIMD_AVX2, true) && archsimd.X86.AVX2():
		return "simd:avx2"
	}
	return "simd:nosimd"
}
