package merge

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func TestClipScales(t *testing.T) {
	tests := []struct {
		name    string
		norms   []float64
		max     float64
		want    []float64
		wantErr error
	}{
		{"within bound untouched", []float64{0.5, 1}, 1, []float64{1, 1}, nil},
		{"above bound scaled to it", []float64{4, 0.5}, 2, []float64{0.5, 1}, nil},
		{"zero norm keeps scale 1", []float64{0}, 1, []float64{1}, nil},
		{"zero bound zeroes non-zero vectors", []float64{0, 3}, 0, []float64{1, 0}, nil},
		{"negative bound", []float64{1}, -1, nil, ErrBadOption},
		{"infinite bound", []float64{1}, math.Inf(1), nil, ErrBadOption},
		{"NaN norm", []float64{math.NaN()}, 1, nil, ErrBadOption},
		{"negative norm", []float64{-1}, 1, nil, ErrBadOption},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ClipScales(tc.norms, tc.max)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("scales = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNormClipValues(t *testing.T) {
	tests := []struct {
		name       string
		xs         [][]float32
		weights    []float64
		max        float64
		want       []float32
		wantScales []float64
	}{
		{
			// Norms 5 and 0.5; the first is scaled by 0.2, so coefficients are
			// float32(0.5·0.2) and 0.5.
			"absolute bound",
			[][]float32{{3, 4}, {0.3, 0.4}}, []float64{1, 1}, 1,
			f32s(0x3ee66667, 0x3f19999a), []float64{0.2, 1},
		},
		{
			// Norms 5, ≈0.5, 1: the median bound is exactly 1.
			"median bound",
			[][]float32{{3, 4}, {0.3, 0.4}, {1, 0}}, []float64{1, 1, 1}, 0,
			f32s(0x3f222222, 0x3eccccce), []float64{0.2, 1, 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]float32, len(tc.want))
			scales, err := NormClip(dst, tc.xs, tc.weights, tc.max, 1)
			if err != nil {
				t.Fatal(err)
			}
			requireBits32(t, "dst", dst, tc.want)
			if !slices.Equal(scales, tc.wantScales) {
				t.Fatalf("scales = %v, want %v", scales, tc.wantScales)
			}
		})
	}
}

func TestNormClipWithinBoundIsWeightedMean(t *testing.T) {
	xs := randVecs(11, 5, 3000)
	w := randWeights(11, 5)
	got, want := make([]float32, 3000), make([]float32, 3000)
	if _, err := NormClip(got, xs, w, 1e30, 2); err != nil {
		t.Fatal(err)
	}
	if err := WeightedMean(want, xs, w, 1); err != nil {
		t.Fatal(err)
	}
	requireBits32(t, "dst", got, want)
}

func TestNormClipErrors(t *testing.T) {
	inf := float32(math.Inf(1))
	if _, err := NormClip(make([]float32, 1), [][]float32{{1}, {inf}}, []float64{1, 1}, 1, 0); !errors.Is(err, ErrNonFinite) {
		t.Errorf("Inf input: err = %v, want ErrNonFinite", err)
	}
	if _, err := NormClip(make([]float32, 1), [][]float32{{1}}, []float64{1}, math.NaN(), 0); !errors.Is(err, ErrBadOption) {
		t.Errorf("NaN bound: err = %v, want ErrBadOption", err)
	}
	if _, err := NormClip(make([]float32, 1), [][]float32{{1}}, []float64{0}, 1, 0); !errors.Is(err, ErrBadWeight) {
		t.Errorf("zero weight: err = %v, want ErrBadWeight", err)
	}
}
