package merge

import (
	"fmt"
	"math"
)

// Aggregator names a way of combining contributions; the values are the config spellings.
type Aggregator string

const (
	// AggMean is the weighted mean (WeightedMean).
	AggMean Aggregator = "mean"
	// AggTrimmedMean drops the most extreme values per coordinate (TrimmedMean).
	AggTrimmedMean Aggregator = "trimmed_mean"
	// AggMedian is the unweighted per-coordinate median (CoordinateMedian).
	AggMedian Aggregator = "median"
	// AggNormClip clips each input's norm before the weighted mean (NormClip).
	AggNormClip Aggregator = "norm_clip"
)

// Aggregators returns every Aggregator, for help texts and config validation.
func Aggregators() []Aggregator {
	return []Aggregator{AggMean, AggTrimmedMean, AggMedian, AggNormClip}
}

// ParseAggregator returns the Aggregator spelled s, or an error wrapping ErrUnknownAggregator.
func ParseAggregator(s string) (Aggregator, error) {
	for _, a := range Aggregators() {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("%w %q (want one of %v)", ErrUnknownAggregator, s, Aggregators())
}

// AggregateOptions holds the knobs of the robust aggregators; each is read only by its own.
type AggregateOptions struct {
	// TrimFraction is the share of inputs dropped at each end per coordinate by
	// trimmed_mean, in [0, 0.5).
	TrimFraction float64
	// ClipNorm is norm_clip's bound; 0 means the median norm of the inputs.
	ClipNorm float64
}

// Aggregate combines xs into dst with the named aggregator. Weights are required and
// validated for every aggregator (one per input, finite, > 0), even for median, which
// ignores them, so a bad weight is caught whichever aggregator a config picks.
func Aggregate(kind Aggregator, dst []float32, xs [][]float32, weights []float64, opts AggregateOptions, workers int) error {
	switch kind {
	case AggMean:
		return WeightedMean(dst, xs, weights, workers)
	case AggTrimmedMean:
		return TrimmedMean(dst, xs, weights, opts.TrimFraction, workers)
	case AggMedian:
		const op = "coordinate median"
		if err := checkInputs(op, dst, xs, weights); err != nil {
			return err
		}
		if _, err := weightSum(op, weights); err != nil {
			return err
		}
		return CoordinateMedian(dst, xs, workers)
	case AggNormClip:
		_, err := NormClip(dst, xs, weights, opts.ClipNorm, workers)
		return err
	default:
		return fmt.Errorf("aggregate: %w %q", ErrUnknownAggregator, kind)
	}
}

// AggregateBlock is Aggregate on one block of values of each input, for merges that stream
// their inputs: norms are the norms of the WHOLE inputs (as Norm computes them), which
// norm_clip needs and the others ignore. Given the norms every aggregator works per
// coordinate, so aggregating block by block gives the bits of Aggregate on whole vectors.
func AggregateBlock(kind Aggregator, dst []float32, xs [][]float32, weights, norms []float64, opts AggregateOptions, workers int) error {
	if kind != AggNormClip {
		return Aggregate(kind, dst, xs, weights, opts, workers)
	}
	const op = "norm clip"
	if err := checkInputs(op, dst, xs, weights); err != nil {
		return err
	}
	if !inRange(opts.ClipNorm, 0, math.MaxFloat64) {
		return fmt.Errorf("%s: %w: max norm %v (want finite and ≥ 0)", op, ErrBadOption, opts.ClipNorm)
	}
	sum, err := weightSum(op, weights)
	if err != nil {
		return err
	}
	_, err = clipMean(op, dst, xs, weights, sum, norms, opts.ClipNorm, workers)
	return err
}
