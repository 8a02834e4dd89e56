package engine

import "math"

// TableSizeForTest exposes the side-table size to the leak test.
func TableSizeForTest() int { return tableSize() }

var _ = math.Exp
