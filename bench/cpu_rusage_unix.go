//go:build unix

package bench

import (
	"os"
	"runtime"
	"syscall"
)

// maxRSS returns the maximum resident set size of a finished process in bytes, from the rusage that wait4
// returned for it (ru_maxrss: KiB on Linux and the BSDs, bytes on macOS).
func maxRSS(state *os.ProcessState) int64 {
	if state == nil {
		return 0
	}
	ru, ok := state.SysUsage().(*syscall.Rusage)
	if !ok {
		return 0
	}
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return int64(ru.Maxrss)
	}
	return int64(ru.Maxrss) << 10
}
