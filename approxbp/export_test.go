package approxbp

// SetPackByMultiply turns Pack's multiply path (the pure-Go backend's) on or off, for testing both paths; it
// returns the previous setting.
func SetPackByMultiply(on bool) bool {
	old := packByMultiplyOn
	packByMultiplyOn = on
	return old
}
