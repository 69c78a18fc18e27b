package merge

import (
	"errors"
	"math"
	"slices"
	"testing"
)

// columns turns per-coordinate rows (one row per coordinate, one value per input) into the
// per-input vectors the API takes, which keeps hand-written cases readable.
func columns(rows ...[]float32) [][]float32 {
	xs := make([][]float32, len(rows[0]))
	for k := range xs {
		xs[k] = make([]float32, len(rows))
		for i, row := range rows {
			xs[k][i] = row[k]
		}
	}
	return xs
}

func TestTrimmedMeanValues(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name    string
		xs      [][]float32
		weights []float64
		trim    float64
		want    []float32
	}{
		{
			// Drops 1 and 100; keeps inputs 0, 2, 3 with weights 1, 3, 4 of 8.
			"drops one at each end, renormalises weights",
			columns([]float32{5, 1, 3, 2, 100}), []float64{1, 2, 3, 4, 5}, 0.2,
			[]float32{2.75},
		},
		{
			// Four equal values: the tie order decides which weights survive. Ordering by
			// index drops input 0 (lowest of the ties) and keeps 1, 2, 4, which gives
			// 0x3f333334; dropping input 4 instead would give 0x3f333333.
			"ties broken by input index",
			columns([]float32{0.7, 0.7, 0.7, 7, 0.7}), []float64{1, 2, 3, 4, 5}, 0.2,
			f32s(0x3f333334),
		},
		{
			// −0 orders below +0, so −0 is trimmed and +0 kept.
			"signed zeros in total order",
			columns([]float32{negZero(), 0, 1}), []float64{1, 1, 1}, 0.34,
			f32s(0x00000000),
		},
		{
			// NaN sorts above +Inf and is trimmed like any extreme value, along with the
			// lowest value 2.
			"NaN trimmed as the largest",
			columns([]float32{nan, 2, 4}), []float64{1, 1, 1}, 0.34,
			[]float32{4},
		},
		{
			"per coordinate sets differ",
			columns([]float32{1, 2, 3}, []float32{30, 10, 20}), []float64{1, 1, 1}, 0.34,
			[]float32{2, 20},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, len(tc.want))
			if err := TrimmedMean(dst, tc.xs, tc.weights, tc.trim, 1); err != nil {
				t.Fatal(err)
			}
			requireBits32(t, "dst", dst, tc.want)
		})
	}
}

func TestTrimmedMeanZeroCutIsWeightedMean(t *testing.T) {
	xs := randVecs(7, 6, 1000)
	w := randWeights(7, 6)
	got, want := make([]float32, 1000), make([]float32, 1000)
	// 0.16·6 = 0.96 floors to 0: nothing trimmed.
	if err := TrimmedMean(got, xs, w, 0.16, 2); err != nil {
		t.Fatal(err)
	}
	if err := WeightedMean(want, xs, w, 1); err != nil {
		t.Fatal(err)
	}
	requireBits32(t, "dst", got, want)
}

func TestTrimmedMeanErrors(t *testing.T) {
	xs := [][]float32{{1}, {2}, {3}}
	w := []float64{1, 1, 1}
	for _, trim := range []float64{-0.1, 0.5, 0.9, math.NaN()} {
		if err := TrimmedMean(make([]float32, 1), xs, w, trim, 0); !errors.Is(err, ErrBadOption) {
			t.Errorf("trim %v: err = %v, want ErrBadOption", trim, err)
		}
	}
	if err := TrimmedMean(make([]float32, 1), xs, []float64{1, 0, 1}, 0.34, 0); !errors.Is(err, ErrBadWeight) {
		t.Errorf("zero weight: err = %v, want ErrBadWeight", err)
	}
	if err := TrimmedMean(make([]float32, 2), xs, w, 0.34, 0); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("long dst: err = %v, want ErrLengthMismatch", err)
	}
}

func TestCoordinateMedianValues(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name string
		xs   [][]float32
		want []float32
	}{
		{"one input", [][]float32{{3, -1}}, []float32{3, -1}},
		{"odd count", columns([]float32{3, -1, 2}), []float32{2}},
		{"even count averages the middle two", columns([]float32{1, 4, 2, 3}), []float32{2.5}},
		{"even count rounds the exact mean once", columns([]float32{1, 2, 1 + 0x1p-23, 5}), f32s(0x3fc00000)},
		{"no overflow at the top of the range", columns([]float32{math.MaxFloat32, math.MaxFloat32}), []float32{math.MaxFloat32}},
		{"large pair", columns([]float32{3e38, 3.4e38}), f32s(0x7f70bdc2)},
		{"NaN sorts last", columns([]float32{nan, 1, 2}), []float32{2}},
		{"signed zeros", columns([]float32{0, negZero(), negZero()}), []float32{negZero()}},
		{"per coordinate", columns([]float32{9, 1, 5}, []float32{-1, -3, -2}), []float32{5, -2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, len(tc.want))
			if err := CoordinateMedian(dst, tc.xs, 1); err != nil {
				t.Fatal(err)
			}
			requireBits32(t, "dst", dst, tc.want)
		})
	}
}

func TestCoordinateMedianErrors(t *testing.T) {
	if err := CoordinateMedian(make([]float32, 1), nil, 0); !errors.Is(err, ErrEmpty) {
		t.Errorf("no inputs: err = %v, want ErrEmpty", err)
	}
	if err := CoordinateMedian(make([]float32, 2), [][]float32{{1, 2}, {1}}, 0); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("short input: err = %v, want ErrLengthMismatch", err)
	}
}

func TestRankKeys(t *testing.T) {
	// Cohorts on both sides of rankByCounting, with repeated values (ties broken by index)
	// and signed zeros; ranks must match a plain sort of (total-order key, index).
	for _, k := range []int{1, 2, 5, rankByCounting, rankByCounting + 1, 40} {
		xs := randVecs(uint64(k), k, 1)
		for j := 0; j < k; j += 3 {
			xs[j][0] = xs[0][0] // ties
		}
		keys := make([]uint64, k)
		for j := range keys {
			keys[j] = sortKey(xs[j][0], j)
		}
		sorted := slices.Clone(keys)
		slices.Sort(sorted)
		want := make([]int, k)
		for pos, key := range sorted {
			want[uint32(key)] = pos
		}
		got := make([]int, k)
		rankKeys(keys, got)
		if !slices.Equal(got, want) {
			t.Fatalf("K=%d: ranks %v, want %v", k, got, want)
		}
	}
	if !(orderKey(float32(math.Inf(-1))) < orderKey(-1) && orderKey(-1) < orderKey(negZero()) &&
		orderKey(negZero()) < orderKey(0) && orderKey(0) < orderKey(1) &&
		orderKey(1) < orderKey(float32(math.Inf(1))) && orderKey(float32(math.Inf(1))) < orderKey(float32(math.NaN()))) {
		t.Fatal("orderKey is not the IEEE total order")
	}
}
