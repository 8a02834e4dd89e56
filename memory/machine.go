package memory

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/memfit/memfit/internal/readfile"
)

// LimitEnv names the environment variable that sets the memory a training step may plan for on the host (bytes,
// or a size such as 16GiB), in place of MachineBytes: to keep room for other processes, or to test the check.
const LimitEnv = "MEMFIT_MEMORY_LIMIT"

// MachineBytes returns the memory this process can have: the smaller of the machine's physical memory
// (MemTotal in /proc/meminfo) and its cgroup's limit (cgroup v2 memory.max, v1 memory.limit_in_bytes), or
// $MEMFIT_MEMORY_LIMIT when set. ok is false when neither can be read (not Linux).
func MachineBytes() (bytes int64, ok bool, err error) {
	if v := os.Getenv(LimitEnv); v != "" {
		b, err := ParseBytes(v)
		if err != nil || b <= 0 {
			return 0, false, fmt.Errorf("$%s=%q: give a positive size such as 16GiB", LimitEnv, v)
		}
		return b, true, nil
	}
	bytes, ok = PhysicalBytes()
	for _, p := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if data, err := readfile.Read(p, readfile.Small); err == nil {
			if lim, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err == nil && lim > 0 && (!ok || lim < bytes) {
				bytes, ok = lim, true
			}
		}
	}
	return bytes, ok, nil
}

// PhysicalBytes returns the machine's physical memory (MemTotal in /proc/meminfo); ok is false where that cannot
// be read.
func PhysicalBytes() (bytes int64, ok bool) {
	data, err := readfile.Read("/proc/meminfo", readfile.Config)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, found := strings.CutPrefix(line, "MemTotal:"); found {
			if f := strings.Fields(v); len(f) > 0 {
				if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return kb << 10, true
				}
			}
		}
	}
	return 0, false
}

// ParseBytes reads a size such as 24GiB, 80GB, 512MiB or a plain number of bytes (positive, below 8 EiB; a
// fraction of a byte is dropped).
func ParseBytes(s string) (int64, error) {
	v, err := ParseSize(s)
	if err != nil || !(v > 0) || v >= 1<<63 {
		return 0, fmt.Errorf("%q is not a size (examples: 24GiB, 80GB, 1.5e9)", s)
	}
	return int64(v), nil
}

// ParseSize reads a size such as 24GiB, 80GB, 512MiB, 1.5e9 or 0.5 as a number of bytes: a number with an
// optional unit (B, KB, MB, GB, TB, PB: powers of 1000; KiB, MiB, GiB, TiB, PiB: powers of 1024), neither rounded nor
// range-checked (it may be a fraction, zero, negative or huge: the caller says what it takes).
func ParseSize(s string) (float64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		scale  float64
	}{{"PiB", 1 << 50}, {"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"PB", 1e15}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	scale := 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, scale = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.scale
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a size (examples: 24GiB, 80GB, 1.5e9)", s)
	}
	return v * scale, nil
}
