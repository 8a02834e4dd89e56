package engine

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// Try runs fn, which may build or run GoMLX graphs, and turns a panic (GoMLX reports graph errors by
// panicking) into an error. The stack is kept only when MEMFIT_DEBUG is set, so user errors stay one line.
func Try(fn func()) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		switch e := r.(type) {
		case error:
			err = e
		default:
			err = fmt.Errorf("%v", e)
		}
		if debugEnabled() {
			err = fmt.Errorf("%w\n%s", err, debug.Stack())
		}
	}()
	fn()
	return nil
}

// ErrNotDifferentiated is returned when memory accounting is asked about a graph that was not differentiated
// with engine.Gradient.
var ErrNotDifferentiated = errors.New("graph was not differentiated with engine.Gradient")
