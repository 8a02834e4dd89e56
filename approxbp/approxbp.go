package approxbp

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/engine"
)

// Activation names an exact activation function.
type Activation int

// The activations approxbp knows.
const (
	ActGELU Activation = iota // exact GELU: x * Phi(x), with Phi computed by erf (not the tanh approximation)
	ActSiLU                   // SiLU (swish): x * sigmoid(x)
	// ActGELUTanh is GELU's tanh form, PyTorch's gelu(approximate="tanh") and transformers' gelu_pytorch_tanh
	// (Gemma's MLP): x * (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))) / 2.
	ActGELUTanh
)

// String returns "gelu" or "silu".
func (a Activation) String() string {
	switch a {
	case ActGELU:
		return "gelu"
	case ActSiLU:
		return "silu"
	case ActGELUTanh:
		return "gelu_pytorch_tanh"
	}
	return fmt.Sprintf("activation(%d)", int(a))
}

// gate returns the multiplicative gate of the activation: Phi(x) for GELU, sigmoid(x) for SiLU.
func gate(act Activation, x *graph.Node) *graph.Node {
	switch act {
	case ActGELU:
		// Phi(x) = (1 + erf(x / sqrt 2)) / 2
		return graph.MulScalar(graph.OnePlus(graph.Erf(graph.MulScalar(x, 1/math.Sqrt2))), 0.5)
	case ActSiLU:
		return graph.Logistic(x)
	case ActGELUTanh:
		// (1 + tanh(u)) / 2, u = sqrt(2/pi) (x + 0.044715 x³)
		return graph.MulScalar(graph.OnePlus(graph.Tanh(tanhGELUArg(x))), 0.5)
	}
	panic(fmt.Sprintf("approxbp: unknown activation %d", int(act)))
}

// forward builds the exact activation as one final node whose first input is x and whose VJP the callers
// replace: the backend's fused activation (exact GELU, SiLU) where it has one (the pure-Go backend: one SIMD
// pass instead of five ops), else Mul(x, gate(x)). Baseline and approximate variants share it, so their forward
// values are bit-identical.
func forward(act Activation, x *graph.Node) *graph.Node {
	if !x.DType().IsFloat() {
		panic(fmt.Sprintf("approxbp: %s needs a float input, got %s", act, x.Shape()))
	}
	if engine.Fused(x, compute.OpTypeFusedActivation) {
		return graph.BackendFusedActivation(x, compute.ActivationConfig{Type: act.fused()})
	}
	return graph.Mul(x, gate(act, x))
}

// fused returns the backend's activation type for act.
func (a Activation) fused() compute.ActivationType {
	switch a {
	case ActSiLU:
		return compute.ActivationSilu
	case ActGELUTanh:
		return compute.ActivationGeluApproximate
	}
	return compute.ActivationGelu
}

// tanhGELUSqrt2OverPi and tanhGELUCubic are the tanh GELU's constants: sqrt(2/pi) and 0.044715.
const (
	tanhGELUSqrt2OverPi = 0.7978845608028654
	tanhGELUCubic       = 0.044715
)

// tanhGELUArg returns u = sqrt(2/pi) (x + 0.044715 x³), the tanh GELU's argument.
func tanhGELUArg(x *graph.Node) *graph.Node {
	return graph.MulScalar(graph.Add(x, graph.MulScalar(graph.Mul(graph.Square(x), x), tanhGELUCubic)), tanhGELUSqrt2OverPi)
}

// inputGrad returns the gradients of y's inputs, dx for the first (x) and nil for any other (y is a node built
// by forward).
func inputGrad(y, dx *graph.Node) []*graph.Node {
	grads := make([]*graph.Node, len(y.Inputs()))
	grads[0] = dx
	return grads
}

// GELU returns the exact (erf) GELU of x. Its backward keeps only x.
//
// Backward: GELU(x) = x Phi(x), so dGELU/dx = Phi(x) + x phi(x), with phi(x) = exp(-x²/2) / sqrt(2 pi).
// The VJP recomputes Phi and phi from x, instead of keeping x, x/sqrt2 and Phi as GoMLX's own gradient does;
// it reads x through engine.Recompute, so no backend merges the recomputed Phi with the forward one (which
// would keep that alive instead). Where the backend has a fused activation gradient (the pure-Go backend's
// FusedActivationVJP: the same formula in one SIMD pass) it computes it; elsewhere it builds it from ops.
func GELU(x *graph.Node) *graph.Node {
	y := forward(ActGELU, x)
	return engine.SetVJP(y, engine.KindActivation, func(node, v *graph.Node) []*graph.Node {
		x := engine.Recompute(node.Inputs()[0])[0] // behind a barrier (an int8 copy under Mesa)
		if d := fusedGrad(ActGELU, x, v); d != nil {
			return inputGrad(node, d)
		}
		phi := graph.MulScalar(graph.Exp(graph.MulScalar(graph.Square(x), -0.5)), 1/math.Sqrt(2*math.Pi))
		d := graph.Add(gate(ActGELU, x), graph.Mul(x, phi))
		return inputGrad(node, graph.Mul(v, d))
	})
}

// SiLU returns x * sigmoid(x). Its backward keeps only x.
//
// Backward: with s = sigmoid(x), d(x s)/dx = s + x s (1 - s) = s (1 + x (1 - s)); s is recomputed from x (in
// one fused pass where the backend has FusedActivationVJP, as for GELU).
func SiLU(x *graph.Node) *graph.Node {
	y := forward(ActSiLU, x)
	return engine.SetVJP(y, engine.KindActivation, func(node, v *graph.Node) []*graph.Node {
		x := engine.Recompute(node.Inputs()[0])[0] // behind a barrier (an int8 copy under Mesa)
		if d := fusedGrad(ActSiLU, x, v); d != nil {
			return inputGrad(node, d)
		}
		s := graph.Logistic(x)
		d := graph.Mul(s, graph.OnePlus(graph.Mul(x, graph.OneMinus(s))))
		return inputGrad(node, graph.Mul(v, d))
	})
}

// GELUTanh returns the tanh-form GELU of x (gelu_pytorch_tanh). Its backward keeps only x.
//
// Backward: with u = sqrt(2/pi) (x + 0.044715 x³) and t = tanh(u), y = x (1 + t) / 2, so
// dy/dx = (1 + t) / 2 + x (1 - t²) u' / 2, u' = sqrt(2/pi) (1 + 3 * 0.044715 x²); t is recomputed from x.
func GELUTanh(x *graph.Node) *graph.Node {
	y := forward(ActGELUTanh, x)
	return engine.SetVJP(y, engine.KindActivation, func(node, v *graph.Node) []*graph.Node {
		// Built from ops, not the backend's fused gradient: the pure-Go backend's (compute v0.1.14, SIMD) returns
		// 1 at x = 2.6 where the derivative is 1.0307 (TestExactGradients).
		x := engine.Recompute(node.Inputs()[0])[0] // behind a barrier (an int8 copy under Mesa)
		t := graph.Tanh(tanhGELUArg(x))
		du := graph.MulScalar(graph.OnePlus(graph.MulScalar(graph.Square(x), 3*tanhGELUCubic)), tanhGELUSqrt2OverPi)
		d := graph.Add(graph.MulScalar(graph.OnePlus(t), 0.5), graph.MulScalar(graph.Mul(x, graph.Mul(graph.OneMinus(graph.Square(t)), du)), 0.5))
		return inputGrad(node, graph.Mul(v, d))
	})
}

// fusedGrad returns v * act'(x) computed by the backend's fused activation gradient (FusedActivationVJP), or
// nil where the backend has none for x's dtype. The backend's GELU and SiLU gradients read only x and v; GoMLX's
// graph builder still asks for the forward output y, so x is passed in its place: it reads nothing more, and the
// backward keeps only x.
func fusedGrad(act Activation, x, v *graph.Node) *graph.Node {
	if !engine.Fused(x, compute.OpTypeFusedActivationVJP) {
		return nil
	}
	return graph.BackendFusedActivationVJP(x, x, v, compute.ActivationConfig{Type: act.fused()})
}

// ReGELU2 returns the exact GELU of x with the Approx-BP 2-bit backward: only the packed codes (x.Size()/4 bytes,
// rounded up) are kept for the backward pass.
func ReGELU2(x *graph.Node) *graph.Node { return Approx(x, ActGELU, ReGELU2Coefficients) }

// ReSiLU2 returns the exact SiLU of x with the Approx-BP 2-bit backward.
func ReSiLU2(x *graph.Node) *graph.Node { return Approx(x, ActSiLU, ReSiLU2Coefficients) }

// ReGELU2Tanh returns the exact tanh-form GELU of x (gelu_pytorch_tanh, Gemma's MLP) with a 2-bit backward whose
// coefficients are fitted to that function (ReGELU2TanhCoefficients).
func ReGELU2Tanh(x *graph.Node) *graph.Node { return Approx(x, ActGELUTanh, ReGELU2TanhCoefficients) }

// Approx returns the exact activation act of x, whose backward uses the step derivative given by coeffs.
//
// Forward: y = x * gate(x) exactly as GELU/SiLU, plus code(x) = sum_i [x > C_i] (k bits per element), packed
// 8/k codes per byte (4 per byte for k = 2; k = 3 uses 4-bit slots, 2 per byte), pinned to y (engine.Pin: the
// returned node is y behind a barrier that also holds the codes). x itself is not kept.
//
// Backward: the ReLU-formed approximation h~(x) = sum_i A_i max(x - C_i, 0) has derivative
// h~'(x) = sum_{i : x > C_i} A_i = Levels[code(x)], a step function of the code alone. So
// dL/dx = v * Levels[code]. The slopes come straight from the saved bytes with one Gather into a 256-row table
// (ByteSlopes: row b holds the slopes of the codes packed in byte b), instead of unpacking the codes with
// divisions and looking the levels up afterwards: one pass over the packed bytes.
func Approx(x *graph.Node, act Activation, coeffs Coefficients) *graph.Node {
	if err := coeffs.Validate(); err != nil {
		panic(err)
	}
	y := forward(act, x)
	// The activation and its codes behind one barrier (engine.Pin), the forward continuing from the barrier's
	// copy: the codes must be made before anything downstream of y runs, so that no backend computes them late or
	// fuses the packing into the backward's slope lookup, either of which keeps x alive until the backward pass.
	y2, res := engine.Pin(y, PackedCodes(x, coeffs.C, coeffs.Bits))
	packed := res[0]
	dims := x.Shape().Dimensions
	table := ByteSlopes(coeffs.Levels(), coeffs.Bits)
	engine.SetVJP(y, engine.KindActivation, func(node, v *graph.Node) []*graph.Node {
		g := v.Graph()
		n, m, per := v.Shape().Size(), packed.Shape().Size(), CodesPerByte(coeffs.Bits)
		rows := graph.ConstAsDType(g, v.DType(), table) // [256, per]
		// The codes through a barrier tied to v (engine.Recompute): the float slopes, as large as x, are computed
		// from the codes alone and could otherwise be looked up during the forward pass and held. (With ties off,
		// engine.Ties, the codes are read as they are, as before issue 35.)
		codes := packed
		if engine.Ties() {
			codes = engine.Recompute(packed)[0]
		}
		slope := graph.Reshape(graph.Gather(rows, graph.Reshape(codes, m, 1)), m*per)
		if m*per != n {
			slope = engine.SliceAxis(slope, 0, 0, n)
		}
		return inputGrad(node, graph.Mul(v, graph.Reshape(slope, dims...)))
	})
	return y2
}

// ByteSlopes returns the [256][per] table whose row b holds levels[code] for each of the per = CodesPerByte(bits)
// codes Pack stores in byte b (slot s is bits s*w .. s*w+w-1); slot values with no level (only in bytes Pack never
// writes) get 0.
func ByteSlopes(levels []float64, bits int) [][]float64 {
	per, w := CodesPerByte(bits), slotBits(bits)
	table := make([][]float64, 256)
	for b := range table {
		table[b] = make([]float64, per)
		for s := 0; s < per; s++ {
			if code := (b >> (s * w)) & (1<<w - 1); code < len(levels) {
				table[b][s] = levels[code]
			}
		}
	}
	return table
}

// Codes returns, for each element of x, the number of breakpoints strictly below it, as uint8 with x's shape.
func Codes(x *graph.Node, breakpoints []float64) *graph.Node {
	var code *graph.Node
	for _, c := range breakpoints {
		above := graph.ConvertDType(graph.GreaterThan(x, graph.Scalar(x.Graph(), x.DType(), c)), dtypes.Uint8)
		if code == nil {
			code = above
		} else {
			code = graph.Add(code, above)
		}
	}
	return code
}

// PackedCodes returns Pack(Codes(x, breakpoints), bits): the codes of x's elements packed CodesPerByte(bits)
// to a byte. On the pure-Go backend it builds them without a uint8 code per element: each comparison's booleans
// are reinterpreted, per CodesPerByte group, as one word (Bitcast, no conversion: a bool is stored as the byte 0
// or 1); the words of the comparisons are summed (the byte of element per*j+s of the sum is that
// element's code: at most 2^bits - 1, so no byte carries) and packed by packWords. Converting the booleans to
// uint8 (what Codes does) costs a branch per element in the Go backend, about 6x a comparison on random data.
// Elsewhere (XLA fuses all of it) it is Pack(Codes(x, breakpoints), bits).
func PackedCodes(x *graph.Node, breakpoints []float64, bits int) *graph.Node {
	per := CodesPerByte(bits)
	wide, ok := packWord[per]
	if !ok || !packByMultiplyOn || x.Graph().Backend().String() != "go" || !littleEndian {
		return Pack(Codes(x, breakpoints), bits)
	}
	g := x.Graph()
	n := x.Shape().Size()
	m := PackedSize(n, bits)
	var sum *graph.Node
	for _, c := range breakpoints {
		// Compare x in its own shape (a Reshape of x would copy it, x being read by the forward activation too)
		// and regroup the booleans, which this op owns, in place.
		above := graph.GreaterThan(x, graph.Scalar(g, x.DType(), c))
		if pad := m*per - n; pad > 0 {
			above = graph.Concatenate([]*graph.Node{graph.Reshape(above, n), graph.Zeros(g, shapes.Make(dtypes.Bool, pad))}, 0)
		}
		word := graph.Bitcast(graph.Reshape(above, m, per), wide)
		if sum == nil {
			sum = word
		} else {
			sum = graph.Add(sum, word)
		}
	}
	if sum == nil { // no breakpoints: every code is 0
		return graph.Zeros(g, shapes.Make(dtypes.Uint8, m))
	}
	return packWords(sum, slotBits(bits))
}

// CodesPerByte returns how many k-bit codes Pack stores in one byte: 8, 4, 2, 2 for k = 1, 2, 3, 4.
func CodesPerByte(bits int) int {
	switch bits {
	case 1:
		return 8
	case 2:
		return 4
	case 3, 4:
		return 2
	}
	panic(fmt.Sprintf("approxbp: bits must be 1..4, got %d", bits))
}

// slotBits is the width of the slot each code occupies inside its byte.
func slotBits(bits int) int { return 8 / CodesPerByte(bits) }

// PackedSize returns the number of bytes Pack produces for n codes of the given width: ceil(n / CodesPerByte).
func PackedSize(n, bits int) int {
	per := CodesPerByte(bits)
	return (n + per - 1) / per
}

// Pack packs uint8 codes (each < 2^bits) of any shape into a flat uint8 vector of PackedSize(n, bits) bytes:
// element per*j + s sits in bits s*w .. s*w+w-1 of byte j, with w = 8/per the slot width. The pure-Go backend
// has no shifts, so the slots are formed by multiplying with powers of two and summing (no carries: each slot
// holds a value below 2^w).
func Pack(codes *graph.Node, bits int) *graph.Node {
	if codes.DType() != dtypes.Uint8 {
		panic(fmt.Sprintf("approxbp.Pack: codes must be uint8, got %s", codes.Shape()))
	}
	per := CodesPerByte(bits)
	n := codes.Shape().Size()
	flat := graph.Reshape(codes, n)
	if pad := PackedSize(n, bits)*per - n; pad > 0 {
		flat = graph.Concatenate([]*graph.Node{flat, graph.Zeros(codes.Graph(), shapes.Make(dtypes.Uint8, pad))}, 0)
	}
	m := PackedSize(n, bits)
	grouped := graph.Reshape(flat, m, per)
	if wide, ok := packWord[per]; ok && packByMultiplyOn && codes.Graph().Backend().String() == "go" && littleEndian {
		return packByMultiply(grouped, wide, slotBits(bits))
	}
	return graph.ReduceSum(graph.Mul(grouped, slotWeights(codes.Graph(), bits)), 1)
}

// packByMultiplyOn enables packByMultiply on the pure-Go backend (tests turn it off to check the other path).
var packByMultiplyOn = true

// packWord is the unsigned type as wide as per uint8 codes.
var packWord = map[int]dtypes.DType{2: dtypes.Uint16, 4: dtypes.Uint32, 8: dtypes.Uint64}

// littleEndian reports whether this machine stores the low byte of a word first (Bitcast then reads byte s of
// a word as its s-th byte from the bottom).
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// packByMultiply packs the [m, per] codes (each below 2^w, per*w = 8) with one multiply instead of a multiply and
// a sum over the per codes of each byte (the pure-Go backend's reductions over a short axis run through a
// generic iterator, several times slower than one pass over m words): Bitcast reinterprets each row of per
// bytes as one word, which packWords packs.
func packByMultiply(grouped *graph.Node, wide dtypes.DType, w int) *graph.Node {
	return packWords(graph.Bitcast(grouped, wide), w)
}

// packWords packs words v [m] of per = 8/w bytes, byte k holding a code c_k below 2^w, into one byte each.
//
// Reading the word little-endian, v = sum_k c_k 256^k. With M = sum_j 2^(w (per-1-j)) 256^j, the coefficient
// of 256^(per-1) in v M is sum_{k+j=per-1} c_k 2^(w (per-1-j)) = sum_k c_k 2^(w k), the packed byte (element
// per*j+k in bits k*w..k*w+w-1, as Pack stores it), and no lower coefficient carries into it: the one of 256^i,
// i < per-1, is at most (2^w - 1) sum_{j<=i} 2^(w (per-1-j)) < 2^(w per) = 256. Higher coefficients wrap away in
// the word's modular multiply, so the packed byte is (v M mod 2^(8 per)) / 256^(per-1).
func packWords(v *graph.Node, w int) *graph.Node {
	wide := v.DType()
	per := 8 / w
	var mult, top uint64
	for j := 0; j < per; j++ {
		mult += uint64(1) << (w*(per-1-j) + 8*j)
	}
	top = uint64(1) << (8 * (per - 1))
	g := v.Graph()
	packed := graph.Div(graph.Mul(v, graph.Scalar(g, wide, mult)), graph.Scalar(g, wide, top))
	return graph.ConvertDType(packed, dtypes.Uint8)
}

// Unpack reverses Pack: it returns the uint8 codes with the given dimensions.
func Unpack(packed *graph.Node, bits int, dims ...int) *graph.Node {
	per := CodesPerByte(bits)
	n := 1
	for _, d := range dims {
		n *= d
	}
	m := packed.Shape().Size()
	if m != PackedSize(n, bits) {
		panic(fmt.Sprintf("approxbp.Unpack: %d bytes cannot hold %d codes of %d bits", m, n, bits))
	}
	g := packed.Graph()
	spread := graph.BroadcastToDims(graph.Reshape(packed, m, 1), m, per)
	slots := graph.Rem(graph.Div(spread, slotWeights(g, bits)), graph.Scalar(g, dtypes.Uint8, 1<<slotBits(bits)))
	flat := graph.Reshape(slots, m*per)
	if m*per != n {
		flat = engine.SliceAxis(flat, 0, 0, n)
	}
	return graph.Reshape(flat, dims...)
}

// slotWeights returns [1, 2^w, 2^2w, ...] as a [1, per] uint8 constant.
func slotWeights(g *graph.Graph, bits int) *graph.Node {
	per := CodesPerByte(bits)
	w := slotBits(bits)
	weights := make([]uint8, per)
	for s := range weights {
		weights[s] = uint8(1 << (s * w))
	}
	return graph.Reshape(graph.Const(g, weights), 1, per)
}
