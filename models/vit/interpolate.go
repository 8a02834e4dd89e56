package vit

// bicubicWeights returns the [out, in] matrix of 1-D bicubic interpolation as torch computes it for
// interpolate(mode="bicubic", align_corners=False): output index o samples the input at
// x = (o + 0.5) * in/out - 0.5, with the cubic convolution kernel of A = -0.75 over the four inputs
// floor(x) - 1 .. floor(x) + 2, indices clamped to the border.
func bicubicWeights(in, out int) [][]float64 {
	const a = -0.75
	cubic1 := func(x float64) float64 { return ((a+2)*x-(a+3))*x*x + 1 }
	cubic2 := func(x float64) float64 { return ((a*x-5*a)*x+8*a)*x - 4*a }
	scale := float64(in) / float64(out)
	w := make([][]float64, out)
	for o := range w {
		w[o] = make([]float64, in)
		x := (float64(o)+0.5)*scale - 0.5
		x0 := floor(x)
		t := x - float64(x0)
		coeffs := [4]float64{cubic2(t + 1), cubic1(t), cubic1(1 - t), cubic2(2 - t)}
		for k, c := range coeffs {
			idx := min(max(x0-1+k, 0), in-1)
			w[o][idx] += c
		}
	}
	return w
}

func floor(x float64) int {
	i := int(x)
	if float64(i) > x {
		i--
	}
	return i
}

// bicubic2D returns the [outH*outW, inH*inW] float32 matrix that interpolates a row-major inH x inW grid to
// outH x outW: the product of the two 1-D interpolations (separable, as torch's bicubic is).
func bicubic2D(inH, inW, outH, outW int) [][]float32 {
	wy := bicubicWeights(inH, outH)
	wx := bicubicWeights(inW, outW)
	m := make([][]float32, outH*outW)
	for oy := 0; oy < outH; oy++ {
		for ox := 0; ox < outW; ox++ {
			row := make([]float32, inH*inW)
			for iy := 0; iy < inH; iy++ {
				if wy[oy][iy] == 0 {
					continue
				}
				for ix := 0; ix < inW; ix++ {
					row[iy*inW+ix] = float32(wy[oy][iy] * wx[ox][ix])
				}
			}
			m[oy*outW+ox] = row
		}
	}
	return m
}
