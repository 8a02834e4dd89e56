package engine

import "math"

// TableSizeForTest exposes the side-table size to the leak test.
func TableSizeForTest() int { return tableSize() }

// XLAConfigForTest exposes the go-xla configuration string builder.
func XLAConfigForTest(path, options string, cuda bool, preallocateEnv string) string {
	return xlaConfig(path, options, cuda, preallocateEnv)
}

var _ = math.Exp
