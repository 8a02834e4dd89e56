package memory

import (
	"strings"
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

// unavailablePrefix starts the Method of a peak that could not be obtained.
const unavailablePrefix = "unavailable: "

// Peak is a peak-memory figure for one execution of a compiled graph. A peak that could not be obtained (see
// UnavailablePeak) has Bytes 0 and a Method starting with "unavailable: ", followed by the reason.
type Peak struct {
	// Bytes is the peak of the bytes held during the execution, including the resident inputs.
	Bytes int64
	// Resident is the part of Bytes held before the execution started and not freed by it (the inputs, i.e.
	// parameters, the constants and whatever else the graph holds), plus Kept.
	Resident int64
	// Kept is the part of Resident the execution itself takes from the pool and never gives back (SimulatePeak
	// only; 0 otherwise): on the Go backend, the packed panels a graph's first large product with a constant
	// operand fills and keeps for the graph's lifetime, and buffers the executor leaks.
	Kept int64
	// Method says how Bytes was obtained.
	Method Method
}

// Transient returns the peak bytes above the resident inputs.
func (p Peak) Transient() int64 { return p.Bytes - p.Resident }

// UnavailablePeak is the Peak recorded for a step whose peak could not be obtained because of err (a backend
// the measurement does not know, a graph the simulation cannot replay, a compute version the executor model was
// not written for): Bytes 0 and Method "unavailable: " + err's message.
func UnavailablePeak(err error) Peak {
	return Peak{Method: Method(unavailablePrefix + err.Error())}
}

// Unavailable returns the reason when m says the peak could not be obtained (a Method of UnavailablePeak).
func (m Method) Unavailable() (reason string, ok bool) {
	return strings.CutPrefix(string(m), unavailablePrefix)
}

// FormatPeak formats a peak figure and its method (as the Bytes and Method of a Peak, or a peak_bytes and
// peak_method pair read back from a results file) for people: FormatBytes(bytes), or "unavailable (<reason>)"
// when the method says the peak could not be obtained. An unavailable peak never prints as "0 B".
func FormatPeak(bytes int64, method string) string { return FormatPeakPrec(bytes, method, 3) }

// FormatPeakPrec is FormatPeak with FormatBytesPrec's number of decimals.
func FormatPeakPrec(bytes int64, method string, decimals int) string {
	if reason, ok := Method(method).Unavailable(); ok {
		return "unavailable (" + reason + ")"
	}
	return FormatBytesPrec(bytes, decimals)
}

// FormatPeakCell is FormatPeakPrec for a table cell: "unavailable" without the reason, which the table's note
// on how its peaks were obtained (the method) carries.
func FormatPeakCell(bytes int64, method string, decimals int) string {
	if _, ok := Method(method).Unavailable(); ok {
		return "unavailable"
	}
	return FormatBytesPrec(bytes, decimals)
}

// LargerPeak folds a peak figure (bytes, method) into a running one (overBytes, overMethod; method "" for none
// yet), as a step reports the largest peak of its programs or a run the largest of its steps: the larger
// figure, except that an unavailable figure wins (the first one's reason is kept), since the largest of
// figures one of which is unknown is unknown.
func LargerPeak(overBytes int64, overMethod string, bytes int64, method string) (int64, string) {
	if _, ok := Method(overMethod).Unavailable(); ok {
		return overBytes, overMethod
	}
	if _, ok := Method(method).Unavailable(); ok || overMethod == "" || bytes > overBytes {
		return bytes, method
	}
	return overBytes, overMethod
}

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
