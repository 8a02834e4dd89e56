//go:build xla

package engine

import (
	"fmt"
	"os"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/xla"
)

// XLALinked reports whether this binary was built with the XLA backend (build tag "xla").
const XLALinked = true

func init() {
	// Never let go-xla download a plugin from the internet.
	_ = os.Setenv(xla.NoAutoInstallEnv, "1")
	xla.EnableAutoInstall(false)
}

func newXLABackend(plugin string) (backend backends.Backend, err error) {
	path, err := findPlugin(plugin)
	if err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			backend, err = nil, fmt.Errorf("backend xla:%s: %v", plugin, r)
		}
	}()
	// An absolute path is loaded directly by go-xla, without any search or download.
	b, err := xla.New(path)
	if err != nil {
		return nil, fmt.Errorf("backend xla:%s: %w", plugin, err)
	}
	return b, nil
}

// XLAAvailable reports whether this binary was built with the XLA/PJRT backend (the xla build tag).
func XLAAvailable() bool { return true }
