package merge

import (
	"fmt"
	"math"
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
// Smaller cohorts are checked against History and the reference vector instead.
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
	// CosineTolerance, when > 0, calibrates the cosine bar from history: once the history
	// holds HistoryWarmup rounds, a delta is rejected when its cosine is below
	// mean − CosineTolerance × spread of the cosines accepted in recent rounds (History;
	// the spread is pulled toward PriorSpread while the history is young), or below half that mean if lower, instead of below the fixed
	// *MinCosine. 0 keeps the fixed bar. The
	// cosine checks run only when MinCosine is set.
	CosineTolerance float64
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
	if !inRange(c.CosineTolerance, 0, math.MaxFloat64) {
		return fmt.Errorf("screen config: %w: cosine tolerance %v (want finite and ≥ 0)", ErrBadOption, c.CosineTolerance)
	}
	return nil
}

// Verdict is the screening finding for one delta.
type Verdict struct {
	Accepted bool
	Reason   Reason
	// Norm is the delta's Euclidean norm (NaN or +Inf for a non-finite delta).
	Norm float64
	// Cosine is the cosine to the sum of the other survivors' unit vectors; 0 when the
	// cohort check did not run for this delta.
	Cosine float64
	// RefCosine is the cosine to the reference vector (the recent merged updates); 0 when
	// there was no reference or the delta did not survive the norm checks.
	RefCosine float64
	// Bar is the cosine bar the delta was held to (NaN when no cosine check ran).
	Bar float64
	// Trusted says RefCosine is to the validator's own reference update (Screening.SetTrusted),
	// whose norm is RefNorm, rather than to the merged updates.
	Trusted bool
	RefNorm float64

	cohortRan, refRan bool // which cosines were computed, for History.Next
}

func (v *Verdict) reject(r Reason) {
	v.Accepted, v.Reason = false, r
}

// Screen checks a cohort of deltas (all the same length) without history or reference and
// returns one verdict per delta, in input order. See Screening for the checks.
func Screen(deltas [][]float32, cfg ScreenConfig, workers int) ([]Verdict, error) {
	return ScreenWith(deltas, nil, History{}, cfg, workers)
}

// ScreenWith is Screen with the history of earlier rounds and a reference vector (nil for
// none): the whole cohort is one block of a Screening.
func ScreenWith(deltas [][]float32, ref []float32, hist History, cfg ScreenConfig, workers int) ([]Verdict, error) {
	return ScreenOnProbation(deltas, ref, hist, nil, cfg, workers)
}

// ScreenOnProbation is ScreenWith with the deltas on probation marked (nil for none; see
// Screening.SetProbation).
func ScreenOnProbation(deltas [][]float32, ref []float32, hist History, probation []bool, cfg ScreenConfig, workers int) ([]Verdict, error) {
	return screenWith(deltas, ref, hist, probation, false, cfg, workers)
}

func screenWith(deltas [][]float32, ref []float32, hist History, probation []bool, trusted bool, cfg ScreenConfig, workers int) ([]Verdict, error) {
	n := 0
	if len(deltas) > 0 {
		n = len(deltas[0])
	}
	for k, d := range deltas {
		if len(d) != n {
			return nil, fmt.Errorf("screen: %w: delta %d has %d elements, delta 0 has %d", ErrLengthMismatch, k, len(d), n)
		}
	}
	s, err := NewScreening(cfg, hist, len(deltas), n, ref != nil, workers)
	if err != nil {
		return nil, err
	}
	if err := s.SetProbation(probation); err != nil {
		return nil, err
	}
	if trusted {
		if err := s.SetTrusted(); err != nil {
			return nil, err
		}
	}
	if err := s.AddNorms(0, deltas); err != nil {
		return nil, err
	}
	if s.NeedsCosines() {
		blocks := make([][]float32, len(deltas))
		for _, k := range s.Active() {
			blocks[k] = deltas[k]
		}
		if err := s.AddCosines(0, blocks, ref); err != nil {
			return nil, err
		}
	}
	return s.Verdicts()
}

// ScreenTrusted is ScreenOnProbation with ref the validator's own reference update
// (Screening.SetTrusted): every delta is judged against it alone.
func ScreenTrusted(deltas [][]float32, ref []float32, hist History, probation []bool, cfg ScreenConfig, workers int) ([]Verdict, error) {
	return screenWith(deltas, ref, hist, probation, true, cfg, workers)
}
