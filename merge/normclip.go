package merge

import (
	"fmt"
	"math"
	"slices"
)

// ClipScales returns, for each norm, the factor min(1, maxNorm/norm) that brings a vector
// of that norm within maxNorm; a zero norm gets 1. Norms must be finite and ≥ 0 and maxNorm
// finite and ≥ 0 (0 scales every non-zero vector to zero).
func ClipScales(norms []float64, maxNorm float64) ([]float64, error) {
	if !inRange(maxNorm, 0, math.MaxFloat64) {
		return nil, fmt.Errorf("clip scales: %w: max norm %v (want finite and ≥ 0)", ErrBadOption, maxNorm)
	}
	scales := make([]float64, len(norms))
	for k, n := range norms {
		if !inRange(n, 0, math.MaxFloat64) {
			return nil, fmt.Errorf("clip scales: %w: norm %d is %v", ErrBadOption, k, n)
		}
		scales[k] = 1
		if n > maxNorm {
			scales[k] = maxNorm / n
		}
	}
	return scales, nil
}

// NormClip sets dst to the weighted mean of the inputs after scaling each one down to norm
// ≤ maxNorm, and returns the scale applied to each input (1 = untouched). maxNorm = 0 means
// "the median norm of the inputs", a bound that adapts to the cohort. The clipping is
// folded into the mean's coefficients — coef_k = float32(w_k/Σw · s_k), no clipped copies
// — so inputs within the bound give bits identical to WeightedMean. Inputs must be finite
// (screen them first).
func NormClip(dst []float32, xs [][]float32, weights []float64, maxNorm float64, workers int) ([]float64, error) {
	const op = "norm clip"
	if err := checkInputs(op, dst, xs, weights); err != nil {
		return nil, err
	}
	if !inRange(maxNorm, 0, math.MaxFloat64) {
		return nil, fmt.Errorf("%s: %w: max norm %v (want finite and ≥ 0)", op, ErrBadOption, maxNorm)
	}
	sum, err := weightSum(op, weights)
	if err != nil {
		return nil, err
	}
	norms := make([]float64, len(xs))
	for k, x := range xs {
		norms[k] = Norm(x, workers)
	}
	return clipMean(op, dst, xs, weights, sum, norms, maxNorm, workers)
}

// clipMean is NormClip with the inputs' norms given (they may be of longer vectors than
// xs: the blocks of a streamed merge).
func clipMean(op string, dst []float32, xs [][]float32, weights []float64, sum float64, norms []float64, maxNorm float64, workers int) ([]float64, error) {
	if len(norms) != len(xs) {
		return nil, fmt.Errorf("%s: %w: %d norms for %d inputs", op, ErrLengthMismatch, len(norms), len(xs))
	}
	for k, n := range norms {
		if math.IsNaN(n) || math.IsInf(n, 0) {
			return nil, fmt.Errorf("%s: %w: input %d (norm %v)", op, ErrNonFinite, k, n)
		}
	}
	if maxNorm == 0 {
		sorted := slices.Clone(norms)
		slices.Sort(sorted)
		maxNorm = medianSorted(sorted)
	}
	scales, err := ClipScales(norms, maxNorm)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	coef := make([]float32, len(xs))
	for k, w := range weights {
		coef[k] = float32(w / sum * scales[k])
	}
	weightedSum(dst, xs, coef, workers)
	return scales, nil
}
