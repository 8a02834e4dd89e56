package engine

import "math"

// TableSizeForTest exposes the side-table size to the leak test.
func TableSizeForTest() int { return tableSize() }

// XLAConfigForTest exposes the go-xla configuration string builder.
func XLAConfigForTest(path, options string, cuda bool, preallocateEnv string) string {
	return xlaConfig(path, options, cuda, preallocateEnv)
}

var _ = math.Exp

// SetProcRoot points NVIDIAGPUs at a fake /proc tree and returns a function restoring the real one.
func SetProcRoot(dir string) (restore func()) {
	old := procRoot
	procRoot = dir
	return func() { procRoot = old }
}
