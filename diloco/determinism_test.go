package diloco

import (
	"fmt"
	"math"
	"testing"

	"github.com/p2pnode/p2pnode/codecs"
)

// Every function must give the same bits whatever the worker count. Each case flattens
// its outputs (floats as bit patterns, bytes as they are) into one []uint32; workers = 1 is
// the reference.
func TestDeterministicAcrossWorkers(t *testing.T) {
	bits := func(xs ...[]float32) []uint32 {
		var out []uint32
		for _, x := range xs {
			for _, v := range x {
				out = append(out, math.Float32bits(v))
			}
		}
		return out
	}
	encoded := func(e Encoded) []uint32 {
		out := bits(e.Scales)
		for _, b := range e.Data {
			out = append(out, uint32(b))
		}
		return out
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	type run func(t *testing.T, a, b []float32, workers int) []uint32
	cases := []struct {
		name string
		run  run
	}{
		{"PseudoGradient", func(t *testing.T, a, b []float32, w int) []uint32 {
			dst := make([]float32, len(a))
			must(t, PseudoGradient(dst, a, b, w))
			return bits(dst)
		}},
		{"OuterStep/nesterov", func(t *testing.T, a, b []float32, w int) []uint32 {
			p, m := append([]float32(nil), a...), make([]float32, len(a))
			for range 3 {
				must(t, OuterStep(p, m, b, paperOuter, w))
			}
			return bits(p, m)
		}},
		{"OuterStep/heavy-ball", func(t *testing.T, a, b []float32, w int) []uint32 {
			p, m := append([]float32(nil), a...), make([]float32, len(a))
			for range 3 {
				must(t, OuterStep(p, m, b, OuterConfig{LR: 0.3, Momentum: 0.5}, w))
			}
			return bits(p, m)
		}},
		{"OuterStep/fedavg", func(t *testing.T, a, b []float32, w int) []uint32 {
			p := append([]float32(nil), a...)
			must(t, OuterStep(p, nil, b, OuterConfig{LR: 1}, w))
			return bits(p)
		}},
	}
	for _, c := range codecs.All() {
		for _, block := range []int{0, 100} {
			cases = append(cases, struct {
				name string
				run  run
			}{fmt.Sprintf("Encode+Decode/%s/block=%d", c, block), func(t *testing.T, a, b []float32, w int) []uint32 {
				r := append([]float32(nil), b...) // a non-zero residual from "last round"
				for i := range r {
					r[i] *= 0.01
				}
				e, err := Encode(c, a, r, block, w)
				must(t, err)
				plain, err := Encode(c, a, nil, block, w)
				must(t, err)
				dst := make([]float32, len(a))
				must(t, Decode(e, dst, w))
				return append(append(encoded(e), encoded(plain)...), bits(r, dst)...)
			}})
		}
	}
	for _, tc := range cases {
		for _, size := range propSizes {
			t.Run(fmt.Sprintf("%s/n=%d", tc.name, size), func(t *testing.T) {
				a, b := randVec(uint64(size), size), randVec(uint64(size)+1, size)
				want := tc.run(t, a, b, 1)
				for _, w := range workerCounts[1:] {
					got := tc.run(t, a, b, w)
					if len(got) != len(want) {
						t.Fatalf("workers %d: %d outputs, want %d", w, len(got), len(want))
					}
					for i := range want {
						if got[i] != want[i] {
							t.Fatalf("workers %d: output %d = %#x, workers 1 gave %#x", w, i, got[i], want[i])
						}
					}
				}
			})
		}
	}
}
