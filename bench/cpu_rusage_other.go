//go:build !unix

package bench

import "os"

// maxRSS is not available without Unix rusage: 0.
func maxRSS(*os.ProcessState) int64 { return 0 }
