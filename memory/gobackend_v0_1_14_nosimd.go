//go:build !goexperiment.simd

package memory

// goBackendBuild returns what this build of compute v0.1.14's Go backend registers, for the executor model in
// gobackend_v0_1_14.go: without GOEXPERIMENT=simd, no SIMD executors and only the portable matrix kernels.
func goBackendBuild() goBuild { return goBuild{} }
