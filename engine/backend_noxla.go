//go:build !xla

package engine

import (
	"fmt"

	"github.com/gomlx/compute"
)

// XLALinked reports whether this binary was built with the XLA backend (build tag "xla").
const XLALinked = false

func newXLABackend(plugin, _ string) (compute.Backend, error) {
	if _, err := findPlugin(plugin); err != nil {
		return nil, fmt.Errorf("%v (and this binary has no XLA support: rebuild with -tags xla, which needs cgo)", err)
	}
	return nil, fmt.Errorf("backend xla:%s: this memfit binary was built without XLA support; rebuild with `go build -tags xla` (needs cgo)", plugin)
}

// XLAAvailable reports whether this binary was built with the XLA/PJRT backend (the xla build tag).
func XLAAvailable() bool { return false }
