package merge

import (
	"fmt"

	"github.com/p2pnode/p2pnode/internal/parallel"
)

// WeightedMean sets dst to the weighted mean of xs:
//
//	dst[i] = Σ_k float32(wn_k · xs[k][i]),  wn_k = float32(w_k / Σw)
//
// Σw is added in index order in float64 and each wn_k is rounded to float32 once; the
// terms are added in k order in float32, starting from the k = 0 term. Callers must pass
// contributions in a canonical order (the node sorts by peer id), since float32 addition is
// not associative. Weights must be finite and > 0. dst must not be one of xs.
func WeightedMean(dst []float32, xs [][]float32, weights []float64, workers int) error {
	const op = "weighted mean"
	if err := checkInputs(op, dst, xs, weights); err != nil {
		return err
	}
	wn, err := normalizedWeights(op, weights)
	if err != nil {
		return err
	}
	weightedSum(dst, xs, wn, workers)
	return nil
}

// EMA sets dst = (1−w)·base + w·mean elementwise, w = newWeight ∈ [0, 1] (the weight of
// the new value, protocol.ema.new_weight; an EMA's "decay" in the usual convention is 1 − w):
//
//	dst[i] = float32(a·base[i]) + float32(b·mean[i]),  a = float32(1 − w), b = float32(w)
//
// (1 − w) is computed in float64 and rounded once. For finite inputs w = 1 gives mean and
// w = 0 gives base (up to the sign of a zero). dst may alias base or mean.
func EMA(dst, base, mean []float32, newWeight float64, workers int) error {
	const op = "ema"
	if len(base) != len(dst) || len(mean) != len(dst) {
		return fmt.Errorf("%s: %w: dst %d, base %d, mean %d elements", op, ErrLengthMismatch, len(dst), len(base), len(mean))
	}
	if !inRange(newWeight, 0, 1) {
		return fmt.Errorf("%s: %w: new weight %v not in [0, 1]", op, ErrBadOption, newWeight)
	}
	a, b := float32(1-newWeight), float32(newWeight)
	parallel.ForChunks(len(dst), parallel.ChunkLen, workers, func(_, lo, hi int) {
		d, x, y := dst[lo:hi], base[lo:hi], mean[lo:hi]
		x, y = x[:len(d)], y[:len(d)]
		for i := range d {
			d[i] = float32(a*x[i]) + float32(b*y[i])
		}
	})
	return nil
}
