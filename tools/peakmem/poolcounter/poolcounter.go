// Package poolcounter installs the byte counter of the patched simplego buffer pool (see ../setup.sh and
// ../simplego-pool-counter.patch) as memfit's memory.PoolCounter. Importing it, usually for its side effect
// alone, makes memory.MeasurePeak report measured peaks (memory.MethodPoolCounter) on the pure-Go backend.
//
// It only builds against the patched GoMLX copy this module replaces github.com/gomlx/gomlx with.
package poolcounter

import (
	"github.com/gomlx/compute/gobackend"

	"github.com/memfit/memfit/memory"
)

func init() { memory.SetPoolCounter(Counter{}) }

// Counter is the patched simplego pool counter. It is process-wide: it counts the buffers of every simplego
// backend in the process, including the parameters transferred to them, but not graph constants, which simplego
// keeps outside its pool.
type Counter struct{}

// Live returns the bytes of the pool buffers currently handed out.
func (Counter) Live() int64 { return gobackend.PoolLiveBytes() }

// Peak returns the maximum of Live since the last ResetPeak.
func (Counter) Peak() int64 { return gobackend.PoolPeakBytes() }

// ResetPeak sets Peak to Live.
func (Counter) ResetPeak() { gobackend.ResetPoolPeakBytes() }

var _ memory.PoolCounter = Counter{}
