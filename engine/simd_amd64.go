//go:build amd64 && goexperiment.simd

package engine

import "simd/archsimd"

const simdBuild = true

func cpuAVX512() bool { return archsimd.X86.AVX512() }
func cpuAVX2() bool   { return archsimd.X86.AVX2() }

func cpuFMA() bool { return archsimd.X86.FMA() }
