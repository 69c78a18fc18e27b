package merge

import (
	"fmt"
	"math"
	"testing"
)

// The property every function here must have: the same inputs give the same bits whatever
// the worker count. Each case computes its outputs as one flat []float64 of bit patterns
// (float32 outputs widened exactly), with workers = 1 as the reference.
func TestDeterministicAcrossWorkers(t *testing.T) {
	type fn func(t *testing.T, xs [][]float32, w []float64, workers int) []float64
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	widen := func(x []float32) []float64 {
		out := make([]float64, len(x))
		for i, v := range x {
			out[i] = float64(v)
		}
		return out
	}
	cases := []struct {
		name string
		k    int
		run  fn
	}{
		{"WeightedMean/K=5", 5, func(t *testing.T, xs [][]float32, w []float64, n int) []float64 {
			dst := make([]float32, len(xs[0]))
			must(t, WeightedMean(dst, xs, w, n))
			return widen(dst)
		}},
		{"WeightedMean/K=8", 8, func(t *testing.T, xs [][]float32, w []float64, n int) []float64 {
			dst := make([]float32, len(xs[0]))
			must(t, WeightedMean(dst, xs, w, n))
			return widen(dst)
		}},
		{"EMA", 2, func(t *testing.T, xs [][]float32, _ []float64, n int) []float64 {
			dst := make([]float32, len(xs[0]))
			must(t, EMA(dst, xs[0], xs[1], 0.37, n))
			return widen(dst)
		}},
		{"TrimmedMean", 7, func(t *testing.T, xs [][]float32, w []float64, n int) []float64 {
			dst := make([]float32, len(xs[0]))
			must(t, TrimmedMean(dst, xs, w, 0.2, n))
			return widen(dst)
		}},
		{"CoordinateMedian/even", 4, func(t *testing.T, xs [][]float32, _ []float64, n int) []float64 {
			dst := make([]float32, len(xs[0]))
			must(t, CoordinateMedian(dst, xs, n))
			return widen(dst)
		}},
		{"CoordinateMedian/odd", 5, func(t *testing.T, xs [][]float32, _ []float64, n int) []float64 {
			dst := make([]float32, len(xs[0]))
			must(t, CoordinateMedian(dst, xs, n))
			return widen(dst)
		}},
		{"NormClip", 5, func(t *testing.T, xs [][]float32, w []float64, n int) []float64 {
			dst := make([]float32, len(xs[0]))
			scales, err := NormClip(dst, xs, w, 0, n)
			must(t, err)
			return append(widen(dst), scales...)
		}},
		{"Norm/Dot/Cosine", 2, func(t *testing.T, xs [][]float32, _ []float64, n int) []float64 {
			d, err := Dot(xs[0], xs[1], n)
			must(t, err)
			c, err := Cosine(xs[0], xs[1], n)
			must(t, err)
			return []float64{Norm(xs[0], n), d, c}
		}},
		{"FirstNonFinite", 1, func(t *testing.T, xs [][]float32, _ []float64, n int) []float64 {
			x := append([]float32(nil), xs[0]...)
			x[len(x)*2/3] = float32(math.Inf(1))
			x[len(x)-1] = float32(math.NaN())
			return []float64{float64(FirstNonFinite(x, n)), float64(FirstNonFinite(xs[0], n))}
		}},
		{"Screen", 6, func(t *testing.T, xs [][]float32, _ []float64, n int) []float64 {
			v, err := Screen(xs, ScreenConfig{MaxNormRatio: 1.5, MinCosine: new(-0.5)}, n)
			must(t, err)
			var out []float64
			for _, x := range v {
				out = append(out, x.Norm, x.Cosine, float64(len(x.Reason)))
			}
			return out
		}},
	}
	for _, tc := range cases {
		for _, size := range propSizes {
			t.Run(fmt.Sprintf("%s/n=%d", tc.name, size), func(t *testing.T) {
				xs := randVecs(uint64(size), tc.k, size)
				w := randWeights(uint64(size), tc.k)
				want := tc.run(t, xs, w, 1)
				for _, workers := range workerCounts[1:] {
					got := tc.run(t, xs, w, workers)
					for i := range want {
						if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
							t.Fatalf("workers %d: output %d = %v, workers 1 gave %v", workers, i, got[i], want[i])
						}
					}
				}
			})
		}
	}
}

// The unrolled, tiled kernel must equal the plain definition across tile and chunk edges.
func TestWeightedMeanMatchesDefinitionLarge(t *testing.T) {
	for _, size := range propSizes {
		xs := randVecs(uint64(size)+1, 7, size)
		w := randWeights(uint64(size), 7)
		dst := make([]float32, size)
		if err := WeightedMean(dst, xs, w, 3); err != nil {
			t.Fatal(err)
		}
		requireBits32(t, fmt.Sprintf("n=%d", size), dst, naiveWeightedMean(xs, w))
	}
}
