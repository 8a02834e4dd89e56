package engine

import (
	"os"
	"strings"
)

// FMAWorkaround says whether this process needs GODEBUG=cpu.fma=off: a SIMD build whose matmul kernels run on a
// CPU with FMA, in a process that has not set it.
//
// Why: GoMLX's AVX2/AVX-512 kernels return with the upper halves of the vector registers dirty (no VZEROUPPER),
// and Go's math.Exp on amd64 (used by the Go backend's Exp and Logistic ops, so by softmax, cross entropy, SiLU and
// sigmoid) mixes VEX-encoded FMA instructions with legacy SSE ones; with dirty upper state every such switch is
// a costly transition. Measured on the 2-core x86-64 build VM (Intel Xeon with AVX-512): math.Exp takes about
// 1.1 µs per call after an AVX-512 kernel instead of 13 ns; with GODEBUG=cpu.fma=off, Go takes its SSE-only
// path and it stays at 12-17 ns (docs/simd.md has the program). GODEBUG's cpu options are read when the Go
// runtime starts, so a process can only get it from its environment.
func FMAWorkaround() bool {
	return SIMD() != "" && cpuFMA() && !godebugHas("cpu.fma", "off")
}

// WithFMAWorkaround returns env (KEY=value pairs) with cpu.fma=off added to GODEBUG.
func WithFMAWorkaround(env []string) []string {
	out := make([]string, 0, len(env)+1)
	found := false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			found = true
			if v != "" {
				v += ","
			}
			kv = "GODEBUG=" + v + "cpu.fma=off"
		}
		out = append(out, kv)
	}
	if !found {
		out = append(out, "GODEBUG=cpu.fma=off")
	}
	return out
}

// ReexecWithFMAWorkaround restarts the running program in place (same process id, arguments and environment, plus
// GODEBUG=cpu.fma=off) when FMAWorkaround says it is needed, on systems that can exec; it returns only if no
// restart happened. Commands call it first thing in main; MEMFIT_NO_REEXEC=1 turns it off. Library users set
// GODEBUG=cpu.fma=off in their own environment instead.
func ReexecWithFMAWorkaround() {
	if !FMAWorkaround() || os.Getenv("MEMFIT_NO_REEXEC") == "1" {
		return
	}
	reexec(WithFMAWorkaround(os.Environ()))
}
