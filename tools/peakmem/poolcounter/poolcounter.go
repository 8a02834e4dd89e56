// Package poolcounter installs the byte counter of the patched Go backend buffer pool (see ../setup.sh and
// ../compute-pool-counter.patch) as memfit's memory.PoolCounter. Importing it, usually for its side effect
// alone, makes memory.MeasurePeak report measured peaks (memory.MethodPoolCounter) on the pure-Go backend.
//
// It only builds against the patched github.com/gomlx/compute copy this module replaces the real one with.
package poolcounter

import (
	"github.com/gomlx/compute/gobackend"

	"github.com/memfit/memfit/memory"
)

func init() { memory.SetPoolCounter(Counter{}) }

// Counter is the patched Go backend's pool counter. It is process-wide: it counts the buffers of every Go
// backend in the process, including the parameters transferred to them, at the bucketed sizes the pool really
// allocates, but not graph constants, which the backend takes from its pool when a graph is built and holds for
// the graph's lifetime (memory.MeasurePeak adds them).
type Counter struct{}

// Live returns the bytes of the pool buffers currently handed out and not yet released.
func (Counter) Live() int64 { return gobackend.PoolLiveBytes() }

// Peak returns the maximum of Live since the last ResetPeak.
func (Counter) Peak() int64 { return gobackend.PoolPeakBytes() }

// ResetPeak sets Peak to Live.
func (Counter) ResetPeak() { gobackend.ResetPoolPeakBytes() }

var _ memory.PoolCounter = Counter{}
