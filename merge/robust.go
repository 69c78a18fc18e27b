package merge

import (
	"github.com/p2pnode/p2pnode/internal/parallel"

	"fmt"
	"math"
)

// TrimmedMean sets dst to a per-coordinate trimmed weighted mean. For each coordinate i it
// orders the K values xs[k][i], drops the c = floor(trimFraction·K) lowest and c highest,
// and takes the weighted mean of the rest exactly as WeightedMean does (weights of the kept
// inputs renormalised per coordinate, their sum added in k order in float64, each
// coefficient rounded to float32, terms added in k order in float32).
//
// Ties are ordered deterministically: values sort by the IEEE 754 total order (so −0 < +0
// and NaNs sort to the ends by sign) and equal values by input index, lower index first —
// so of two equal lowest values the one from the lower index is dropped first.
// trimFraction must lie in [0, 0.5); when c = 0 the result is bit-identical to
// WeightedMean. trimFraction·K is evaluated in float64, so e.g. 0.3·10 gives c = 3.
func TrimmedMean(dst []float32, xs [][]float32, weights []float64, trimFraction float64, workers int) error {
	const op = "trimmed mean"
	if err := checkInputs(op, dst, xs, weights); err != nil {
		return err
	}
	if !(trimFraction >= 0 && trimFraction < 0.5) {
		return fmt.Errorf("%s: %w: trim fraction %v not in [0, 0.5)", op, ErrBadOption, trimFraction)
	}
	if _, err := weightSum(op, weights); err != nil {
		return err
	}
	K := len(xs)
	cut := int(math.Floor(trimFraction * float64(K)))
	if cut == 0 {
		return WeightedMean(dst, xs, weights, workers)
	}
	span := uint(K - 2*cut)
	parallel.ForChunks(len(dst), parallel.ChunkLen, workers, func(_, lo, hi int) {
		keys := make([]uint64, K)
		rank := make([]int, K)
		kept := make([]int, K)
		for i := lo; i < hi; i++ {
			for k, x := range xs {
				keys[k] = sortKey(x[i], k)
			}
			rankKeys(keys, rank)
			// Compact the kept indices (ranks cut … K−cut−1) in k order. One unsigned
			// comparison compiles to a flag-set rather than a branch; the ranks are random,
			// and a mispredicted branch per input costs more than the arithmetic.
			n := 0
			for k, r := range rank {
				kept[n] = k
				if uint(r-cut) < span {
					n++
				}
			}
			var sum float64
			for _, k := range kept[:n] {
				sum += weights[k]
			}
			acc := float32(float32(weights[kept[0]]/sum) * xs[kept[0]][i])
			for _, k := range kept[1:n] {
				acc += float32(float32(weights[k]/sum) * xs[k][i])
			}
			dst[i] = acc
		}
	})
	return nil
}

// CoordinateMedian sets dst[i] to the median of xs[0][i] … xs[K−1][i]: the middle value
// for odd K, and for even K the mean of the two middle values, computed in float64 (exact)
// and rounded once to float32. Values are ordered by the IEEE 754 total order, so the result
// is well defined even with NaNs or signed zeros. The median is unweighted. dst must not be
// one of xs.
func CoordinateMedian(dst []float32, xs [][]float32, workers int) error {
	const op = "coordinate median"
	if err := checkVectors(op, dst, xs); err != nil {
		return err
	}
	K := len(xs)
	lower, upper := (K-1)/2, K/2 // the middle rank(s); equal for odd K
	parallel.ForChunks(len(dst), parallel.ChunkLen, workers, func(_, lo, hi int) {
		keys := make([]uint64, K)
		rank := make([]int, K)
		for i := lo; i < hi; i++ {
			for k, x := range xs {
				keys[k] = sortKey(x[i], k)
			}
			rankKeys(keys, rank)
			var a, b float32
			for k, x := range xs {
				if rank[k] == lower {
					a = x[i]
				}
				if rank[k] == upper {
					b = x[i]
				}
			}
			if lower == upper {
				dst[i] = a
				continue
			}
			dst[i] = float32((float64(a) + float64(b)) / 2)
		}
	})
	return nil
}
