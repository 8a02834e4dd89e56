//go:build !xla

package memory

import (
	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
)

// XLASizes are the sizes, in bytes, that XLA reports for a compiled program on its device
// (pjrt.ExecutableMemoryUsageStats of go-xla v0.4.1 to v0.4.13).
type XLASizes struct {
	// GeneratedCode is the size of the compiled code.
	GeneratedCode int64
	// Inputs is the size of the program's arguments.
	Inputs int64
	// Outputs is the size of the program's results.
	Outputs int64
	// Aliases is the size of the results that reuse (alias) argument buffers: donated inputs.
	Aliases int64
	// Temporary is the size of the temporaries XLA's buffer assignment allocates for the program.
	Temporary int64
}

// XLAProgramSizes returns the device memory sizes XLA computed when it compiled g. This build has no XLA
// support: it always returns ErrNoXLA.
func XLAProgramSizes(g *graph.Graph) (XLASizes, error) { return XLASizes{}, ErrNoXLA }

// XLAProgramPeak returns the peak device memory of one execution of g as XLA planned it. This build has no XLA
// support: it always returns ErrNoXLA.
func XLAProgramPeak(g *graph.Graph) (Peak, error) { return Peak{}, ErrNoXLA }

// XLADeviceStats returns the memory statistics of an XLA device. This build has no XLA support: it always
// returns ErrNoXLA.
func XLADeviceStats(backend compute.Backend, device int) (DeviceStats, error) {
	return DeviceStats{}, ErrNoXLA
}
