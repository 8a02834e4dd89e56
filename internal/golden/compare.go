package golden

import "math"

// RelMaxDiff returns max_i |got_i - want_i| / max_i |want_i|: the error relative to the reference's scale (the
// measure golden/README.md quotes). Lengths must match (+Inf otherwise).
func RelMaxDiff(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var maxDiff, maxRef float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		maxDiff = math.Max(maxDiff, d)
		maxRef = math.Max(maxRef, math.Abs(float64(want[i])))
	}
	if maxRef == 0 {
		return maxDiff
	}
	return maxDiff / maxRef
}
