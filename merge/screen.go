package merge

import (
	"fmt"
	"math"
	"slices"
)

// Reason says why Screen rejected a delta; it is empty for an accepted one. The values are
// stable strings meant for logs, metrics labels and status output.
type Reason string

const (
	// ReasonNone: accepted.
	ReasonNone Reason = ""
	// ReasonNonFinite: the delta holds NaN or ±Inf.
	ReasonNonFinite Reason = "non_finite"
	// ReasonNormBound: the norm exceeds the absolute bound ScreenConfig.MaxNorm.
	ReasonNormBound Reason = "norm_bound"
	// ReasonNormOutlier: the norm exceeds MaxNormRatio × the cohort's median norm.
	ReasonNormOutlier Reason = "norm_outlier"
	// ReasonLowCosine: the delta points away from the others (cosine below MinCosine).
	ReasonLowCosine Reason = "low_cosine"
)

// MinRelativeCohort is the smallest cohort for which the relative checks (norm ratio to the
// median, cosine to the others) run: with two deltas neither can tell which one is odd.
const MinRelativeCohort = 3

// ScreenConfig selects the checks Screen runs on a cohort of deltas. The zero value checks
// only that values are finite.
type ScreenConfig struct {
	// MaxNorm rejects a delta whose Euclidean norm exceeds it; 0 disables the check.
	MaxNorm float64
	// MaxNormRatio rejects a delta whose norm exceeds MaxNormRatio × the median norm of the
	// deltas that passed the checks above; 0 disables it, otherwise it must be ≥ 1 (below
	// 1 it would reject honest deltas just above the median).
	MaxNormRatio float64
	// MinCosine, when set, rejects a delta whose cosine to the sum of the other surviving
	// deltas is below *MinCosine, in [−1, 1]. A pointer so that 0 ("reject anything
	// pointing away from the others") is a valid threshold; nil disables the check.
	MinCosine *float64
}

// Validate reports an out-of-range field, naming it.
func (c ScreenConfig) Validate() error {
	if !inRange(c.MaxNorm, 0, math.MaxFloat64) {
		return fmt.Errorf("screen config: %w: max norm %v (want finite and ≥ 0)", ErrBadOption, c.MaxNorm)
	}
	if c.MaxNormRatio != 0 && !inRange(c.MaxNormRatio, 1, math.MaxFloat64) {
		return fmt.Errorf("screen config: %w: max norm ratio %v (want 0 or finite and ≥ 1)", ErrBadOption, c.MaxNormRatio)
	}
	if c.MinCosine != nil && !inRange(*c.MinCosine, -1, 1) {
		return fmt.Errorf("screen config: %w: min cosine %v (want [−1, 1])", ErrBadOption, *c.MinCosine)
	}
	return nil
}

// Verdict is Screen's finding for one delta.
type Verdict struct {
	Accepted bool
	Reason   Reason
	// Norm is the delta's Euclidean norm (NaN or +Inf for a non-finite delta).
	Norm float64
	// Cosine is the cosine to the coordinate-wise median of the other survivors of the
	// norm checks; it is 0 when the cosine check did not run for this delta.
	Cosine float64
}

// Screen checks a cohort of deltas (all the same length) and returns one verdict per delta,
// in input order. The checks run in stages, each on the survivors of the previous one:
//
//  1. non-finite values (ReasonNonFinite);
//  2. the absolute norm bound (ReasonNormBound);
//  3. the norm relative to the survivors' median norm, if ≥ MinRelativeCohort survive
//     (ReasonNormOutlier);
//  4. the cosine of each survivor to the coordinate-wise median of the OTHER survivors of
//     stage 3, if ≥ MinRelativeCohort survive (ReasonLowCosine). A median is the reference
//     because attackers that pass the norm checks (a flipped or a random update of honest
//     size) pull a mean toward themselves and can push an honest update below the bar; a
//     median follows the honest majority. The delta itself is left out, or a random update
//     would correlate with the median wherever it is the middle value. Verdicts are
//     decided on the same set of survivors, so one rejection never changes another's.
//
// No stage depends on the order in which deltas are visited, so permuting the cohort
// permutes the verdicts. Callers still pass a canonical order so that validators agree to
// the bit. An empty cohort gives no verdicts.
func Screen(deltas [][]float32, cfg ScreenConfig, workers int) ([]Verdict, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("screen: %w", err)
	}
	for k, d := range deltas {
		if len(d) != len(deltas[0]) {
			return nil, fmt.Errorf("screen: %w: delta %d has %d elements, delta 0 has %d", ErrLengthMismatch, k, len(d), len(deltas[0]))
		}
	}
	verdicts := make([]Verdict, len(deltas))
	var alive []int
	for k, d := range deltas {
		n := Norm(d, workers)
		verdicts[k] = Verdict{Accepted: true, Norm: n}
		switch {
		case math.IsNaN(n) || math.IsInf(n, 0):
			verdicts[k].reject(ReasonNonFinite)
		case cfg.MaxNorm > 0 && n > cfg.MaxNorm:
			verdicts[k].reject(ReasonNormBound)
		default:
			alive = append(alive, k)
		}
	}
	if cfg.MaxNormRatio > 0 && len(alive) >= MinRelativeCohort {
		norms := make([]float64, len(alive))
		for j, k := range alive {
			norms[j] = verdicts[k].Norm
		}
		slices.Sort(norms)
		limit := cfg.MaxNormRatio * medianSorted(norms)
		alive = slices.DeleteFunc(alive, func(k int) bool {
			if verdicts[k].Norm > limit {
				verdicts[k].reject(ReasonNormOutlier)
				return true
			}
			return false
		})
	}
	if cfg.MinCosine != nil && len(alive) >= MinRelativeCohort {
		ref := make([]float32, len(deltas[0]))
		others := make([][]float32, 0, len(alive)-1)
		for _, k := range alive {
			others = others[:0]
			for _, o := range alive {
				if o != k {
					others = append(others, deltas[o])
				}
			}
			if err := CoordinateMedian(ref, others, workers); err != nil {
				return nil, fmt.Errorf("screen: %w", err)
			}
			c, err := Cosine(deltas[k], ref, workers)
			if err != nil {
				return nil, fmt.Errorf("screen: %w", err)
			}
			verdicts[k].Cosine = c
			if c < *cfg.MinCosine {
				verdicts[k].reject(ReasonLowCosine)
			}
		}
	}
	return verdicts, nil
}

func (v *Verdict) reject(r Reason) {
	v.Accepted, v.Reason = false, r
}
