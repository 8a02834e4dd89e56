package gguf

import (
	"io"
	"math/rand/v2"
	"testing"
)

// BenchmarkEncode measures converting float32 values to each tensor type (input bytes/s): the export's
// conversion cost per tensor. Run: go test ./gguf -run '^$' -bench Encode
func BenchmarkEncode(b *testing.B) {
	x := make([]float32, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for _, typ := range []TensorType{F32, F16, BF16, Q8_0} {
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * len(x)))
			var buf []byte
			for b.Loop() {
				for i := 0; i < len(x); i += chunk {
					buf, _ = Encode(buf[:0], typ, x[i:i+chunk])
					io.Discard.Write(buf)
				}
			}
		})
	}
}

// BenchmarkDecode measures dequantising each tensor type to float32 (output bytes/s): the cost of reading a
// GGUF model back.
func BenchmarkDecode(b *testing.B) {
	x := make([]float32, 1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for _, typ := range []TensorType{F32, F16, BF16, Q8_0} {
		b.Run(typ.String(), func(b *testing.B) {
			src, _ := Encode(nil, typ, x)
			out := make([]float32, len(x))
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				if err := Decode(out, typ, src); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
