package merge

import (
	"fmt"
	"math"
)

// checkInputs verifies the shape shared by every aggregator: at least one input, every
// input as long as dst, and one weight per input.
func checkInputs(op string, dst []float32, xs [][]float32, weights []float64) error {
	if err := checkVectors(op, dst, xs); err != nil {
		return err
	}
	if len(weights) != len(xs) {
		return fmt.Errorf("%s: %w: %d weights for %d inputs", op, ErrLengthMismatch, len(weights), len(xs))
	}
	return nil
}

// checkVectors verifies that xs is non-empty, every xs[k] is as long as dst, and dst is
// not one of the inputs: the kernels read later inputs after writing dst, so writing into
// an input would silently corrupt the result. (Only an identical start is detected; a
// partial overlap is the caller's bug.)
func checkVectors(op string, dst []float32, xs [][]float32) error {
	if len(xs) == 0 {
		return fmt.Errorf("%s: %w", op, ErrEmpty)
	}
	for k, x := range xs {
		if len(x) != len(dst) {
			return fmt.Errorf("%s: %w: input %d has %d elements, dst has %d", op, ErrLengthMismatch, k, len(x), len(dst))
		}
		if len(x) > 0 && &x[0] == &dst[0] {
			return fmt.Errorf("%s: %w: input %d", op, ErrAliased, k)
		}
	}
	return nil
}

// weightSum checks every weight and returns Σw added in index order in float64, the one
// summation order every validator uses.
func weightSum(op string, weights []float64) (float64, error) {
	var sum float64
	for k, w := range weights {
		if !(w > 0) || math.IsInf(w, 0) {
			return 0, fmt.Errorf("%s: %w: weight %d is %v (want finite and > 0)", op, ErrBadWeight, k, w)
		}
		sum += w
	}
	if math.IsInf(sum, 0) {
		return 0, fmt.Errorf("%s: %w: weights sum to +Inf", op, ErrBadWeight)
	}
	return sum, nil
}

// normalizedWeights returns wn_k = float32(w_k / Σw), computed once in float64 and rounded
// once, so every validator feeds the same float32 coefficients into the merge kernel.
func normalizedWeights(op string, weights []float64) ([]float32, error) {
	sum, err := weightSum(op, weights)
	if err != nil {
		return nil, err
	}
	wn := make([]float32, len(weights))
	for k, w := range weights {
		wn[k] = float32(w / sum)
	}
	return wn, nil
}

// isFinite32 reports whether v is neither NaN nor ±Inf: the exponent field is not all ones.
func isFinite32(v float32) bool {
	return math.Float32bits(v)&0x7f800000 != 0x7f800000
}

// inRange reports whether v lies in [lo, hi]; NaN never does.
func inRange(v, lo, hi float64) bool {
	return v >= lo && v <= hi
}
