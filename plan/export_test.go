package plan

// SetStepSecondsForTest replaces the time the fast calibration takes for each timed step (f gets the mode, the
// cut model's blocks and the measured seconds) until the returned function restores it.
func SetStepSecondsForTest(f func(mode string, blocks int, measured float64) float64) (restore func()) {
	old := stepSeconds
	stepSeconds = f
	return func() { stepSeconds = old }
}
