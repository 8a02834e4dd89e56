//go:build !(linux || darwin || freebsd)

package engine

// reexec is not available here: the program goes on without the workaround.
func reexec(env []string) { _ = env }
