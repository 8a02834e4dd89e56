//go:build linux || darwin || freebsd

package engine

import (
	"os"
	"syscall"
)

// reexec replaces the process image with the same program, arguments and the given environment. A failure leaves
// the process running as it was.
func reexec(env []string) {
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, env)
}
