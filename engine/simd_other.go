//go:build !(amd64 && goexperiment.simd)

package engine

const simdBuild = false

func cpuAVX512() bool { return false }
func cpuAVX2() bool   { return false }

func cpuFMA() bool { return false }
