package chattemplate

import "time"

// SetNow sets the clock strftime_now reads and returns a function that restores it.
func SetNow(f func() time.Time) func() {
	old := now
	now = f
	return func() { now = old }
}
