package merge

import (
	"math"
	"slices"
)

// Calibration constants. They are part of the merge rule (every validator must use the
// same), so they are constants, not options.
const (
	// HistoryWarmup is the number of rounds of history after which the calibrated bars
	// replace the fixed ones.
	HistoryWarmup = 5
	// HistoryRate is the weight of the newest round once the history is longer than
	// 1/HistoryRate rounds (before that every round counts equally): the statistics follow
	// an honest run whose updates drift as it converges, with a memory of ~10 rounds.
	HistoryRate = 0.1
	// MinSpread is the smallest spread a calibrated cosine bar assumes, so that a run of
	// nearly identical updates does not make the bar so tight that honest noise fails it.
	MinSpread = 0.02
	// PriorSpread and PriorRounds: a calibrated bar assumes the spread of the history's
	// cosines pulled toward PriorSpread as if PriorRounds rounds of that spread came first
	// (Moments.calSpread). Five or six rounds say little about how far honest cosines can
	// stray: a lone digits trainer's first six cosines to the momentum lay within −0.10 and
	// −0.035 (spread 0.023, bar −0.152), its seventh was −0.205, and every retry on that
	// base failed the same way, so the round never closed (TestLateJoinerCatchesUp in CI).
	// Over thirteen 60-round solo runs the cosines ranged from −0.33 to 0.10 (spread 0.065).
	PriorSpread = 0.1
	PriorRounds = HistoryWarmup
	// NoiseZ sets the noise bar: a delta of n values whose cosine to its reference is below
	// NoiseZ/√n points no more along it than a random direction does by chance (the cosine
	// of an independent Gaussian vector is about N(0, 1/n); NoiseZ = 4 lets one in 30 000
	// through). The cosine bars never fall below it while honest updates clear it easily
	// (see Screening.bar), so noise at an honest norm and updates pointing away from the
	// others are rejected even when the calibrated bar is negative.
	NoiseZ = 4
	// FloorZ: once the history is warm, the floor (max(min_cosine, noise bar)) holds only
	// while the accepted cosines clear it by FloorZ spreads, mean − FloorZ × spread ≥
	// floor, so that it rejects under 1 % of honest updates (about 0.6 % for a normal
	// spread).
	FloorZ = 2.5
	// MaxNoiseBar caps the noise bar for small models (below 400 values NoiseZ/√n would
	// exceed it).
	MaxNoiseBar = 0.2
	// SelfZ sets the least bar against a trusted reference (Screening.SetPrevious): the
	// cosine between consecutive references, less SelfZ spreads of it (History.Self).
	// Honest updates spread wider about the reference than the references about each
	// other: at 4 spreads converged digits (3 trainers, 300 rounds) lost 4 honest updates of
	// 900 to the limit, at 5 none, one and one in three runs, at 6 none in four; the drift
	// row merged 50, 55 and 56 drifted updates of 192 (docs/security.md).
	SelfZ = 6
)

// Moments are running statistics of one screening cosine over the accepted deltas of
// recent rounds.
type Moments struct {
	N    uint64  // rounds folded in
	Mean float64 // running mean
	Var  float64 // running mean squared deviation from the mean
}

// History is what screening remembers of earlier rounds: the statistics of the deltas it
// accepted. It is carried in each head (so every validator starts a round from the same
// history and reaches the same verdicts) and computed only from merged deltas, so a run
// whose attackers were screened out has the same history as a run without them.
type History struct {
	Rounds uint64  // rounds folded in
	Norm   float64 // running mean of each round's median accepted norm
	Cohort Moments // cosine to the other survivors (cohorts of ≥ MinRelativeCohort)
	Ref    Moments // cosine to the reference vector
	// Self: the cosine of each round's trusted reference to the reference its base was
	// screened with (two validator windows on consecutive bases, which no trainer trains).
	// Merged updates do not move it: it is what keeps the bar against the reference from
	// following updates that drift away from it round by round (Screening.SetPrevious).
	Self Moments
}

func (h History) warm() bool { return h.Rounds >= HistoryWarmup }

// Next folds one round's verdicts into the history: the accepted deltas' median norm and
// cosines. A round with nothing accepted leaves it unchanged. All arithmetic is float64 in
// a fixed order, so validators agree to the bit.
func (h History) Next(verdicts []Verdict) History {
	var norms, cohort, ref []float64
	for _, v := range verdicts {
		if !v.Accepted {
			continue
		}
		norms = append(norms, v.Norm)
		cohort = appendIf(cohort, v.Cosine, v.cohortRan)
		ref = appendIf(ref, v.RefCosine, v.refRan)
	}
	if len(norms) == 0 {
		return h
	}
	slices.Sort(norms)
	a := rate(h.Rounds)
	next := h
	next.Rounds++
	next.Norm = h.Norm + float64(a*(medianSorted(norms)-h.Norm))
	next.Cohort = h.Cohort.fold(cohort)
	next.Ref = h.Ref.fold(ref)
	return next
}

// WithSelf folds one round's cosine between consecutive references (Screening.SelfCosine)
// into the history, at most one spread above the history's mean; NaN (no such cosine this
// round) leaves it unchanged. Two references that drew the same microshard agree far
// better than windows on different data do (0.95–0.99 among 0.25–0.41 in the drift row
// of docs/security.md); folded whole, such a round made the spread, and so the margin
// under the mean, three times as wide, and the limit fell below anything drift reaches.
// A low cosine is folded whole: it lowers the limit, which can only let more through.
func (h History) WithSelf(c float64) History {
	if math.IsNaN(c) || math.IsInf(c, 0) {
		return h
	}
	if h.Self.N > 0 {
		c = min(c, h.Self.Mean+h.Self.calSpread())
	}
	h.Self = h.Self.fold([]float64{c})
	return h
}

// selfLimit is the least bar against the trusted reference: what two honest windows of
// consecutive bases have shown, less SelfZ spreads — the history's mean or this round's
// cosine c, whichever is lower, so one odd round of the references lowers it at once.
// −Inf (no limit) while fewer than HistoryWarmup rounds are known or without c.
func (h History) selfLimit(c float64) float64 {
	if h.Self.N < HistoryWarmup || math.IsNaN(c) || math.IsInf(c, 0) {
		return math.Inf(-1)
	}
	tol := float64(SelfZ * h.Self.calSpread())
	return min(h.Self.Mean, c) - tol
}

func appendIf(xs []float64, x float64, ok bool) []float64 {
	if ok && !math.IsNaN(x) && !math.IsInf(x, 0) {
		return append(xs, x)
	}
	return xs
}

// rate is the weight of the next round after n rounds: 1/(n+1), at least HistoryRate.
func rate(n uint64) float64 { return max(1/float64(n+1), HistoryRate) }

// calSpread is the spread a calibrated bar is set by: the history's, pulled toward
// PriorSpread as if PriorRounds rounds of it had been folded in first, and at least
// MinSpread. The pull fades as rounds accumulate (under 10 % of the variance after 50).
func (m Moments) calSpread() float64 {
	n := float64(m.N)
	v := float64(n*m.Var) + float64(PriorRounds*PriorSpread*PriorSpread)
	return max(math.Sqrt(v/(n+PriorRounds)), MinSpread)
}

// fold adds one round's values: the mean moves toward the round's mean and the spread
// toward the round's mean squared deviation from the old mean (from the round's own mean
// for the first round).
func (m Moments) fold(xs []float64) Moments {
	if len(xs) == 0 {
		return m
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	center := m.Mean
	if m.N == 0 {
		center = mean
	}
	var dev float64
	for _, x := range xs {
		dev += float64((x - center) * (x - center))
	}
	dev /= float64(len(xs))
	a := rate(m.N)
	return Moments{N: m.N + 1, Mean: m.Mean + float64(a*(mean-m.Mean)), Var: m.Var + float64(a*(dev-m.Var))}
}
