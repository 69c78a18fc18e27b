package merge

import (
	"errors"
	"testing"
)

func TestParseAggregator(t *testing.T) {
	for _, a := range Aggregators() {
		got, err := ParseAggregator(string(a))
		if err != nil || got != a {
			t.Errorf("ParseAggregator(%q) = %q, %v", a, got, err)
		}
	}
	for _, s := range []string{"", "Mean", "krum", "norm-clip"} {
		if _, err := ParseAggregator(s); !errors.Is(err, ErrUnknownAggregator) {
			t.Errorf("ParseAggregator(%q): err = %v, want ErrUnknownAggregator", s, err)
		}
	}
}

func TestAggregateDispatch(t *testing.T) {
	// Rows: one coordinate, five inputs, one outlier.
	xs := columns([]float32{1, 2, 3, 4, 100})
	w := []float64{1, 1, 1, 1, 1}
	tests := []struct {
		kind Aggregator
		opts AggregateOptions
		want float32
	}{
		{AggMean, AggregateOptions{}, 22},
		{AggTrimmedMean, AggregateOptions{TrimFraction: 0.2}, 3},
		{AggMedian, AggregateOptions{}, 3},
		// Median norm 3: the 100 is scaled to 3 and the 4 to 3, mean (1+2+3+3+3)/5.
		{AggNormClip, AggregateOptions{}, 2.4},
	}
	for _, tc := range tests {
		t.Run(string(tc.kind), func(t *testing.T) {
			dst := make([]float32, 1)
			if err := Aggregate(tc.kind, dst, xs, w, tc.opts, 1); err != nil {
				t.Fatal(err)
			}
			if d := dst[0] - tc.want; d > 1e-5 || d < -1e-5 {
				t.Fatalf("%s = %v, want %v", tc.kind, dst[0], tc.want)
			}
		})
	}
}

func TestAggregateErrors(t *testing.T) {
	xs := [][]float32{{1}, {2}, {3}}
	dst := make([]float32, 1)
	if err := Aggregate("krum", dst, xs, []float64{1, 1, 1}, AggregateOptions{}, 0); !errors.Is(err, ErrUnknownAggregator) {
		t.Errorf("unknown: err = %v", err)
	}
	// Median ignores weights but still rejects bad ones.
	if err := Aggregate(AggMedian, dst, xs, []float64{1, -1, 1}, AggregateOptions{}, 0); !errors.Is(err, ErrBadWeight) {
		t.Errorf("median, bad weight: err = %v", err)
	}
	if err := Aggregate(AggMedian, dst, xs, []float64{1}, AggregateOptions{}, 0); !errors.Is(err, ErrLengthMismatch) {
		t.Errorf("median, missing weights: err = %v", err)
	}
	if err := Aggregate(AggTrimmedMean, dst, xs, []float64{1, 1, 1}, AggregateOptions{TrimFraction: 0.6}, 0); !errors.Is(err, ErrBadOption) {
		t.Errorf("trim 0.6: err = %v", err)
	}
}
