package diloco

import (
	"testing"

	"github.com/p2pnode/p2pnode/codecs"
)

// BenchmarkCodec measures encoding and decoding of a 4M-element delta (MB/s of float32
// input or output).
func BenchmarkCodec(b *testing.B) {
	const n = 1 << 22
	x := randVec(1, n)
	for _, c := range codecs.All() {
		b.Run("encode/"+string(c), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				if _, err := Encode(c, x, nil, 0, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("encode-feedback/"+string(c), func(b *testing.B) {
			r := make([]float32, n)
			b.SetBytes(4 * n)
			for b.Loop() {
				if _, err := Encode(c, x, r, 0, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		e, err := Encode(c, x, nil, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		dst := make([]float32, n)
		b.Run("decode/"+string(c), func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				if err := Decode(e, dst, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOuterStep measures a Nesterov step over 4M parameters (MB/s of parameters).
func BenchmarkOuterStep(b *testing.B) {
	const n = 1 << 22
	p, m, g := randVec(1, n), make([]float32, n), randVec(2, n)
	b.SetBytes(4 * n)
	for b.Loop() {
		if err := OuterStep(p, m, g, nodeOuter, 0); err != nil {
			b.Fatal(err)
		}
	}
}
