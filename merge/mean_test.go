package merge

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

func TestWeightedMeanValues(t *testing.T) {
	// Expected bit patterns were computed independently (Python, rounding every float32
	// operation through struct.pack).
	tests := []struct {
		name    string
		xs      [][]float32
		weights []float64
		want    []float32
	}{
		{"single input is copied", [][]float32{{1.5, -2, 0}}, []float64{7}, []float32{1.5, -2, 0}},
		{"exact quarters", [][]float32{{1, 2, 3}, {3, 4, 5}}, []float64{1, 3}, []float32{2.5, 3.5, 4.5}},
		{"thirds round per term", [][]float32{{1}, {1}}, []float64{1, 2}, f32s(0x3f800000)},
		{"three equal weights", [][]float32{{0.1, -3}, {0.2, 5}, {0.3, 7}}, []float64{1, 1, 1}, f32s(0x3e4cccce, 0x40400001)},
		{
			"five inputs (a group of four, then one)",
			[][]float32{{0.1, -1.5}, {0.2, -3}, {0.3, -4.5}, {0.4, -6}, {0.5, -7.5}},
			[]float64{1, 2, 3, 4, 5},
			f32s(0x3ebbbbbc, 0xc0b00000),
		},
		{"empty vectors", [][]float32{{}, {}}, []float64{1, 1}, []float32{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, len(tc.want))
			if err := WeightedMean(dst, tc.xs, tc.weights, 1); err != nil {
				t.Fatal(err)
			}
			requireBits32(t, "dst", dst, tc.want)
		})
	}
}

// naiveWeightedMean is the definition, written as plainly as possible.
func naiveWeightedMean(xs [][]float32, weights []float64) []float32 {
	var sum float64
	for _, w := range weights {
		sum += w
	}
	out := make([]float32, len(xs[0]))
	for i := range out {
		var acc float32
		for k, x := range xs {
			term := float32(float32(weights[k]/sum) * x[i])
			if k == 0 {
				acc = term
			} else {
				acc = acc + term
			}
		}
		out[i] = acc
	}
	return out
}

func TestWeightedMeanMatchesDefinition(t *testing.T) {
	// Every K from 1 to 13 exercises each combination of the four-input groups.
	for k := 1; k <= 13; k++ {
		xs := randVecs(uint64(k), k, 5000)
		w := randWeights(uint64(k), k)
		dst := make([]float32, 5000)
		if err := WeightedMean(dst, xs, w, 3); err != nil {
			t.Fatal(err)
		}
		requireBits32(t, fmt.Sprintf("K=%d", k), dst, naiveWeightedMean(xs, w))
	}
}

func TestWeightedMeanErrors(t *testing.T) {
	two := [][]float32{{1, 2}, {3, 4}}
	dst := make([]float32, 2)
	tests := []struct {
		name    string
		dst     []float32
		xs      [][]float32
		weights []float64
		want    error
	}{
		{"no inputs", dst, nil, nil, ErrEmpty},
		{"short input", dst, [][]float32{{1, 2}, {3}}, []float64{1, 1}, ErrLengthMismatch},
		{"short dst", make([]float32, 1), two, []float64{1, 1}, ErrLengthMismatch},
		{"missing weight", dst, two, []float64{1}, ErrLengthMismatch},
		{"zero weight", dst, two, []float64{1, 0}, ErrBadWeight},
		{"negative weight", dst, two, []float64{-1, 2}, ErrBadWeight},
		{"NaN weight", dst, two, []float64{math.NaN(), 1}, ErrBadWeight},
		{"Inf weight", dst, two, []float64{math.Inf(1), 1}, ErrBadWeight},
		{"weights overflow", dst, two, []float64{math.MaxFloat64, math.MaxFloat64}, ErrBadWeight},
		{"dst is an input", two[1], two, []float64{1, 1}, ErrAliased},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := WeightedMean(tc.dst, tc.xs, tc.weights, 0)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestEMA(t *testing.T) {
	tests := []struct {
		name       string
		base, mean []float32
		decay      float64
		want       []float32
	}{
		{"decay 0.1", []float32{1, 0.5}, []float32{3, -0.7}, 0.1, f32s(0x3f99999a, 0x3ec28f5c)},
		{"weight 1 is the mean", []float32{1, 0.5}, []float32{3, -0.7}, 1, []float32{3, -0.7}},
		{"weight 0 is the base", []float32{1, 0.5}, []float32{3, -0.7}, 0, []float32{1, 0.5}},
		{"half way", []float32{1, -4}, []float32{3, 4}, 0.5, []float32{2, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, len(tc.base))
			if err := EMA(dst, tc.base, tc.mean, tc.decay, 1); err != nil {
				t.Fatal(err)
			}
			requireBits32(t, "dst", dst, tc.want)
			// In place over base gives the same bits.
			base := append([]float32(nil), tc.base...)
			if err := EMA(base, base, tc.mean, tc.decay, 2); err != nil {
				t.Fatal(err)
			}
			requireBits32(t, "in place", base, tc.want)
		})
	}
}

func TestEMAErrors(t *testing.T) {
	v := []float32{1, 2}
	tests := []struct {
		name            string
		dst, base, mean []float32
		decay           float64
		want            error
	}{
		{"short base", make([]float32, 2), v[:1], v, 0.5, ErrLengthMismatch},
		{"short mean", make([]float32, 2), v, v[:1], 0.5, ErrLengthMismatch},
		{"weight above 1", make([]float32, 2), v, v, 1.5, ErrBadOption},
		{"negative decay", make([]float32, 2), v, v, -0.1, ErrBadOption},
		{"NaN decay", make([]float32, 2), v, v, math.NaN(), ErrBadOption},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := EMA(tc.dst, tc.base, tc.mean, tc.decay, 0); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}
