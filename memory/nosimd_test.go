//go:build !(amd64 && goexperiment.simd)

package memory

// wantFloat32DotImpl is the DotGeneral implementation the Go backend registers for float32 (and bfloat16) in
// this build: without GOEXPERIMENT=simd (or off amd64), the portable kernels (dot/matmul/nosimd.go).
func wantFloat32DotImpl() string { return "simd:nosimd" }
