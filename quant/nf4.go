// Package quant holds memfit's quantised storage: NF4 base weights for QLoRA (4-bit NormalFloat codes in blocks
// of 64 with absmax scales, the scales double-quantised to 8 bits in blocks of 256 after subtracting their mean,
// as bitsandbytes does), dequantised inside the training graph in the forward pass and again in the backward
// pass so the full-precision weight is never kept between them.
package quant

import (
	"fmt"
	"math"
	"sort"
)

// NF4Code is the 4-bit NormalFloat code book of QLoRA (Dettmers et al. 2023; bitsandbytes' NF4 table): the
// quantiles of a standard normal distribution scaled to [-1, 1], with an exact zero.
var NF4Code = [16]float32{
	-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
	-0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
	0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
}

// Block sizes: NF4 values share one absmax per BlockSize; double quantisation groups DQBlockSize absmaxes.
const (
	BlockSize   = 64
	DQBlockSize = 256
)

// nf4Mid are the decision thresholds between neighbouring code values: a normalised value above mid[i] gets a
// code above i (a value exactly on a threshold takes the lower code, as bitsandbytes' comparison tree does).
var nf4Mid = func() [15]float32 {
	var m [15]float32
	for i := range m {
		m[i] = (NF4Code[i] + NF4Code[i+1]) / 2
	}
	return m
}()

// QuantizeNF4Value returns the code of a value normalised to [-1, 1].
func QuantizeNF4Value(x float32) uint8 {
	// The number of thresholds strictly below x.
	return uint8(sort.Search(len(nf4Mid), func(i int) bool { return nf4Mid[i] >= x }))
}

// DynamicMap is bitsandbytes' signed dynamic 8-bit map (create_dynamic_map(signed=True, max_exponent_bits=7,
// total_bits=8)), used to double-quantise the NF4 block scales: for exponents e = -6..0 the 2^(e+6) midpoints of
// an even split of [0.1, 1], times 10^e, with both signs, plus 0 and 1, sorted.
var DynamicMap = func() [256]float32 {
	var data []float32
	for i := 0; i < 7; i++ {
		n := 1<<i + 1
		bounds := make([]float32, n)
		for k := range bounds { // torch.linspace(0.1, 1, n) in float32
			bounds[k] = float32(0.1 + (1-0.1)*float64(k)/float64(n-1))
		}
		bounds[n-1] = 1
		scale := float32(math.Pow(10, float64(-6+i)))
		for k := 0; k+1 < n; k++ {
			mean := (bounds[k] + bounds[k+1]) / 2
			data = append(data, scale*mean, -scale*mean)
		}
	}
	data = append(data, 0, 1)
	sort.Slice(data, func(a, b int) bool { return data[a] < data[b] })
	var out [256]float32
	copy(out[:], data)
	return out
}()

// quantizeDynamic returns the index of the map value nearest to x (the lower one on a tie).
func quantizeDynamic(x float32) uint8 {
	i := sort.Search(256, func(i int) bool { return DynamicMap[i] >= x })
	switch {
	case i == 0:
		return 0
	case i == 256:
		return 255
	}
	if x-DynamicMap[i-1] <= DynamicMap[i]-x {
		return uint8(i - 1)
	}
	return uint8(i)
}

// NF4 is a weight matrix [Out, In] quantised to NF4. Values are taken in row-major order (bitsandbytes' layout),
// in blocks of BlockSize consecutive values, two 4-bit codes per byte, the first in the high nibble.
type NF4 struct {
	Out, In int
	// Codes holds ceil(Out*In/2) bytes.
	Codes []uint8
	// Absmax is the per-block scale, when not double-quantised.
	Absmax []float32
	// Double quantisation: the block scales minus Offset (their mean), quantised with DynamicMap in groups of
	// DQBlockSize: scale[b] = DynamicMap[AbsmaxQ[b]] * Absmax2[b/DQBlockSize] + Offset.
	AbsmaxQ []uint8
	Absmax2 []float32
	Offset  float32
	// ColScale multiplies input channel j (column j) after dequantisation; nil means 1. MS-norm folding puts the
	// norm's gamma here (see Fold).
	ColScale []float32
}

// QuantizeNF4 quantises w ([out, in], row-major) to NF4, with double quantisation of the scales when double.
func QuantizeNF4(w []float32, out, in int, double bool) (*NF4, error) {
	if out <= 0 || in <= 0 || len(w) != out*in {
		return nil, fmt.Errorf("quant: weight of %d values is not [%d, %d]", len(w), out, in)
	}
	n := len(w)
	blocks := (n + BlockSize - 1) / BlockSize
	q := &NF4{Out: out, In: in, Codes: make([]uint8, (n+1)/2)}
	absmax := make([]float32, blocks)
	for b := 0; b < blocks; b++ {
		var m float32
		for _, v := range w[b*BlockSize : min(n, (b+1)*BlockSize)] {
			m = max(m, float32(math.Abs(float64(v))))
		}
		absmax[b] = m
		for i := b * BlockSize; i < min(n, (b+1)*BlockSize); i++ {
			var x float32
			if m > 0 {
				x = w[i] * (1 / m) // bitsandbytes multiplies by the reciprocal
			}
			c := QuantizeNF4Value(x)
			if i%2 == 0 {
				q.Codes[i/2] = c << 4
			} else {
				q.Codes[i/2] |= c
			}
		}
	}
	if !double {
		q.Absmax = absmax
		return q, nil
	}
	var mean float64
	for _, a := range absmax {
		mean += float64(a)
	}
	q.Offset = float32(mean / float64(blocks))
	groups := (blocks + DQBlockSize - 1) / DQBlockSize
	q.AbsmaxQ = make([]uint8, blocks)
	q.Absmax2 = make([]float32, groups)
	for g := 0; g < groups; g++ {
		lo, hi := g*DQBlockSize, min(blocks, (g+1)*DQBlockSize)
		var m float32
		for _, a := range absmax[lo:hi] {
			m = max(m, float32(math.Abs(float64(a-q.Offset))))
		}
		q.Absmax2[g] = m
		for b := lo; b < hi; b++ {
			var x float32
			if m > 0 {
				x = (absmax[b] - q.Offset) * (1 / m)
			}
			q.AbsmaxQ[b] = quantizeDynamic(x)
		}
	}
	return q, nil
}

// Scales returns the per-block scales (dequantised when double-quantised).
func (q *NF4) Scales() []float32 {
	if q.AbsmaxQ == nil {
		return q.Absmax
	}
	out := make([]float32, len(q.AbsmaxQ))
	for b, c := range q.AbsmaxQ {
		out[b] = DynamicMap[c]*q.Absmax2[b/DQBlockSize] + q.Offset
	}
	return out
}

// Dequantize returns the weight [Out, In] (row-major) the codes stand for, ColScale applied.
func (q *NF4) Dequantize() []float32 {
	n := q.Out * q.In
	scales := q.Scales()
	w := make([]float32, n)
	for i := range w {
		c := q.Codes[i/2] >> 4
		if i%2 == 1 {
			c = q.Codes[i/2] & 15
		}
		w[i] = NF4Code[c] * scales[i/BlockSize]
		if q.ColScale != nil {
			w[i] *= q.ColScale[i%q.In]
		}
	}
	return w
}

// Fold folds an MS-norm's gamma into the quantised weight: W' = W diag(gamma), exactly, as a per-input-channel
// scale applied after dequantisation (the codes and block scales are untouched, so double-quantised scales need
// no requantisation). It multiplies into an existing ColScale.
func (q *NF4) Fold(gamma []float32) error {
	if len(gamma) != q.In {
		return fmt.Errorf("quant: gamma has %d values for %d input channels", len(gamma), q.In)
	}
	if q.ColScale == nil {
		q.ColScale = make([]float32, q.In)
		for j := range q.ColScale {
			q.ColScale[j] = 1
		}
	}
	for j, g := range gamma {
		q.ColScale[j] *= g
	}
	return nil
}

// Bytes returns the storage of the quantised weight: codes, scales (8-bit and their second-level scales and
// offset when double-quantised) and the column scales.
func (q *NF4) Bytes() int64 {
	b := int64(len(q.Codes)) + 4*int64(len(q.Absmax)) + int64(len(q.AbsmaxQ)) + 4*int64(len(q.Absmax2))
	if q.AbsmaxQ != nil {
		b += 4
	}
	return b + 4*int64(len(q.ColScale))
}
