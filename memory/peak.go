package memory

import (
	"sync"
)

// Method says how a peak figure was obtained.
type Method string

// The ways memfit obtains a peak-memory figure.
const (
	// MethodPoolCounter: a real count of the bytes held by the pure-Go backend's buffer pool while the step
	// ran (builds with the counter only; see tools/peakmem).
	MethodPoolCounter Method = "measured: Go backend buffer-pool counter"
	// MethodSimulation: a liveness simulation over the pure-Go executor's real op order, buffer reuse and
	// scratch buffers (an estimate, checked against the pool counter in tools/peakmem's tests; an upper bound
	// when large matrix products run on several workers, see SimulatePeak).
	MethodSimulation Method = "estimate: liveness simulation of the Go backend executor"
	// MethodXLACompiled: the XLA compiled program's argument + output - alias + temporary sizes.
	MethodXLACompiled Method = "XLA compiled-program sizes (arguments + outputs - aliases + temporaries)"
)

// Peak is a peak-memory figure for one execution of a compiled graph.
type Peak struct {
	// Bytes is the peak of the bytes held during the execution, including the resident inputs.
	Bytes int64
	// Resident is the part of Bytes held before the execution started and not freed by it: the inputs
	// (parameters) and constants.
	Resident int64
	// Method says how Bytes was obtained.
	Method Method
}

// Transient returns the peak bytes above the resident inputs.
func (p Peak) Transient() int64 { return p.Bytes - p.Resident }

// PoolCounter is implemented by builds of GoMLX's pure-Go backend (github.com/gomlx/compute/gobackend) that count
// the bytes their buffer pool hands out (tools/peakmem carries such a build). Live is the bytes currently handed
// out and not yet released, Peak the maximum of Live since the last ResetPeak, and ResetPeak sets Peak to Live.
// Bytes are the sizes the pool really allocates (bucketed, see SimulatePeak); graph constants are not counted.
type PoolCounter interface {
	Live() int64
	Peak() int64
	ResetPeak()
}

var (
	counterMu sync.Mutex
	counter   PoolCounter
)

// SetPoolCounter installs the pool counter used by Measure. Builds of memfit against the patched backend call it
// from an init function; the shipped binary never does.
func SetPoolCounter(c PoolCounter) {
	counterMu.Lock()
	counter = c
	counterMu.Unlock()
}

// HasPoolCounter reports whether a pool counter is installed.
func HasPoolCounter() bool {
	counterMu.Lock()
	defer counterMu.Unlock()
	return counter != nil
}

func poolCounter() PoolCounter {
	counterMu.Lock()
	defer counterMu.Unlock()
	return counter
}
