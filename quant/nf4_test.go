package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// Hand-computed codes: a block with absmax 2 normalises to x/2; the thresholds are the midpoints of the code book.
func TestNF4ByHand(t *testing.T) {
	w := make([]float32, 64)
	w[0], w[1], w[2], w[3], w[4] = 1.0, -2.0, 0.4, 2.0, 0.0803
	// 1.0/2 = 0.5: between 0.4407 (12) and 0.5626 (13), midpoint 0.50166 -> 12.
	// -1 -> 0. 0.2: between 0.1609 (9) and 0.2461 (10), midpoint 0.2035 -> 9. 1 -> 15.
	// 0.04015: the midpoint of 0 (7) and 0.0796 (8) is 0.03979 -> 8. The zeros -> 7.
	q, err := QuantizeNF4(w, 1, 64, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []uint8{12<<4 | 0, 9<<4 | 15, 8<<4 | 7, 7<<4 | 7}
	for i, b := range want {
		if q.Codes[i] != b {
			t.Errorf("byte %d = %#x, want %#x", i, q.Codes[i], b)
		}
	}
	if q.Absmax[0] != 2 {
		t.Errorf("absmax %g", q.Absmax[0])
	}
	d := q.Dequantize()
	for i, want := range []float32{2 * NF4Code[12], -2, 2 * NF4Code[9], 2, 2 * NF4Code[8], 0} {
		if d[i] != want {
			t.Errorf("dequantised %d = %g, want %g", i, d[i], want)
		}
	}
	// The code book's own values come back exactly.
	for c, v := range NF4Code {
		if got := QuantizeNF4Value(v); int(got) != c {
			t.Errorf("code of %g = %d, want %d", v, got, c)
		}
	}
}

func TestDynamicMap(t *testing.T) {
	// 127 positive values, 127 negatives, 0 and 1, strictly increasing from -0.99297 to 1.
	if DynamicMap[0] > -0.99 || DynamicMap[0] < -1 || DynamicMap[255] != 1 {
		t.Errorf("ends %g, %g", DynamicMap[0], DynamicMap[255])
	}
	for i := 1; i < 256; i++ {
		if !(DynamicMap[i] > DynamicMap[i-1]) {
			t.Fatalf("not increasing at %d: %g, %g", i, DynamicMap[i-1], DynamicMap[i])
		}
	}
	// The smallest magnitude is 1e-6 * 0.55 (the single midpoint of [0.1, 1] at exponent -6).
	if DynamicMap[127] != 0 || math.Abs(float64(DynamicMap[128])-0.55e-6) > 1e-12 {
		t.Errorf("around zero: %g %g", DynamicMap[127], DynamicMap[128])
	}
}

// TestDoubleQuantError quantises a normal(0, 0.02) 1024 x 1024 matrix and reports the mean absolute errors of
// the double-quantised scales and of the weights; double quantisation must add little to NF4's own error.
func TestDoubleQuantError(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const out, in = 1024, 1024
	w := make([]float32, out*in)
	for i := range w {
		w[i] = float32(0.02 * r.NormFloat64())
	}
	single, _ := QuantizeNF4(w, out, in, false)
	double, _ := QuantizeNF4(w, out, in, true)
	var scaleErr, rel float64
	s2 := double.Scales()
	for b, a := range single.Absmax {
		scaleErr += math.Abs(float64(s2[b] - a))
		rel += math.Abs(float64(s2[b]-a)) / float64(a)
	}
	scaleErr /= float64(len(s2))
	rel /= float64(len(s2))
	mae := func(q *NF4) float64 {
		var e float64
		for i, v := range q.Dequantize() {
			e += math.Abs(float64(v - w[i]))
		}
		return e / float64(len(w))
	}
	e1, e2 := mae(single), mae(double)
	t.Logf("scales: mean abs error %.3g (%.3f%% relative); weights: mean abs error %.4g (NF4) -> %.4g (NF4 + double quant), weight std 0.02",
		scaleErr, 100*rel, e1, e2)
	if rel > 0.01 {
		t.Errorf("double-quantised scales are %.2f%% off on average", 100*rel)
	}
	if e2 > e1*1.01 {
		t.Errorf("double quantisation raises the weight error from %g to %g", e1, e2)
	}
	bits := float64(double.Bytes()) * 8 / float64(out*in)
	if math.Abs(bits-4.127) > 0.01 {
		t.Errorf("%.4f bits per parameter, want about 4.127 (4 + 8/64 + 32/(64*256))", bits)
	}
}

// Folding gamma into the NF4 weight equals folding it into the dequantised weight, to the last bit here (both
// multiply the same two float32 numbers).
func TestFoldNF4(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const out, in = 96, 40 // blocks straddle rows: the fold does not depend on the block layout
	w := make([]float32, out*in)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	gamma := make([]float32, in)
	for j := range gamma {
		gamma[j] = float32(r.NormFloat64()) // negative values too
	}
	q, _ := QuantizeNF4(w, out, in, true)
	plain := q.Dequantize()
	if err := q.Fold(gamma); err != nil {
		t.Fatal(err)
	}
	folded := q.Dequantize()
	for i := range plain {
		if want := plain[i] * gamma[i%in]; folded[i] != want {
			t.Fatalf("value %d: %g, want %g", i, folded[i], want)
		}
	}
	if err := q.Fold(gamma[:3]); err == nil {
		t.Error("a gamma of the wrong size was accepted")
	}
}
