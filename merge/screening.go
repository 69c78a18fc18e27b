package merge

import (
	"fmt"
	"math"
	"slices"

	"github.com/p2pnode/p2pnode/internal/parallel"
)

// Screening screens a cohort of K deltas of n values that are read block by block, so a
// validator never holds the deltas in memory. It makes at most two passes over the blocks,
// each costing O(K·n):
//
//  1. AddNorms: norms. Then, each stage on the survivors of the previous one:
//     non-finite values (ReasonNonFinite); the absolute bound MaxNorm (ReasonNormBound);
//     the norm relative to the survivors' median norm when ≥ MinRelativeCohort survive,
//     or else to the history's typical norm (from its first round on) and, for a pair,
//     to the smaller of the two (ReasonNormOutlier).
//  2. AddCosines (only if NeedsCosines): with ≥ MinRelativeCohort survivors, the cosine of
//     each survivor u_k to the sum of the OTHER survivors' unit vectors, U − u_k, where
//     U = Σ u_j is one reference for the whole round (ReasonLowCosine). Unit vectors keep a
//     scaled update from steering the reference, and leaving the delta itself out keeps a
//     random update from agreeing with a reference it is part of. Once the history is warm
//     a cohort is also held to the reference vector (its own bar from the history): the
//     reference is made of merged updates only, so a third of the cohort agreeing on a
//     sign flip, which pulls U, cannot pull it. With fewer survivors
//     the cohort says nothing about who is odd, so each survivor is held to the reference
//     vector instead (the recent merged updates every validator holds, e.g. the outer
//     momentum; the fixed bar until the history is warm, then a bar never above the floor,
//     see decideCosines). With no reference (or a zero
//     one) a pair is held to each other: when they disagree both are rejected. A lone
//     update with nothing to compare to is not judged by direction. Cosines to the
//     reference are computed whenever one is given, so the history learns what honest
//     updates look like.
//
// The cosine bar is the fixed *MinCosine (or the noise bar NoiseZ/√n if higher) until the
// history holds HistoryWarmup rounds and, when CosineTolerance > 0, mean −
// CosineTolerance × spread of the cosines accepted in recent rounds afterwards (the
// spread pulled toward PriorSpread while the history is young, and at least MinSpread:
// Moments.calSpread), capped at half that mean and raised to the floor max(*MinCosine, noise bar)
// while the accepted cosines clear the floor by FloorZ spreads (see bar). A cohort's bars
// are never above half of the round's median cosine unless that is below the floor, and a
// round of one or two updates is never held to the momentum above the floor: the
// calibrated bars learn from merged updates only, so they cannot follow honest cosines
// that fall while nothing is merged, and a round whose every update fails them fails on
// every retry on its base (decideCosines); in such a round a delta of the swarm's only
// trainer is not held to the momentum at all (SetSole). Deltas on
// probation (SetProbation: senders the chain has not merged often enough recently) are
// held to at least the floor once the history is warm, whatever the calibrated bar, where
// honest updates clear the floor by far; against a trusted reference (SetTrusted), to a
// positive cosine always, and to half the history's mean cosine (at most the floor) where
// some update of the round reaches it. Against a trusted reference every delta is held,
// in rounds where some update clears the floor, to at least the lower of the floor and
// the limit the references themselves set (SetPrevious: the cosine between this round's
// reference and the base's, less SelfZ spreads), which no trainer's update moves.
//
// Blocks must come in order, start at a multiple of parallel.ChunkLen (except past the
// end) and cover [0, n) exactly once per pass. Reductions add one float64 partial per
// parallel.ChunkLen chunk in chunk order, so norms equal Norm's bits and the verdicts do
// not depend on the block length or the worker count. Verdicts are decided on the same set
// of survivors, so one rejection never changes another's.
type Screening struct {
	cfg     ScreenConfig
	hist    History
	k, n    int
	hasRef  bool
	workers int

	pos      int // values consumed by the current pass
	sumsq    []float64
	verdicts []Verdict
	alive    []int
	decided  bool // norm stages decided
	cohort   bool // cohort cosine check
	refCheck bool // reference cosine check (a small cohort's only one; a cohort's second)
	pair     bool // two survivors: their mutual cosine is computed (U summed over both)

	probation []bool // deltas held to the floor once the history is warm (SetProbation)
	sole      []bool // deltas of the only peer the recent chain merged (SetSole)
	trusted   bool   // the reference is the validator's own update (SetTrusted)
	previous  bool   // the base's reference comes beside the round's (SetPrevious)

	inv      []float32 // 1/‖d_k‖ of the survivors
	unit     []float32 // U for the current block
	dotU     []float64
	dotR     []float64
	uu, rr   float64
	dotP, pp float64 // the base's reference: its dot with the round's, its squared norm
	finished bool
}

// NewScreening starts screening k deltas of n values each. hasRef says whether AddCosines
// will be given a reference vector.
func NewScreening(cfg ScreenConfig, hist History, k, n int, hasRef bool, workers int) (*Screening, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("screen: %w", err)
	}
	if k < 0 || n < 0 {
		return nil, fmt.Errorf("screen: %w: %d deltas of %d values", ErrLengthMismatch, k, n)
	}
	return &Screening{cfg: cfg, hist: hist, k: k, n: n, hasRef: hasRef, workers: workers,
		sumsq: make([]float64, k), verdicts: make([]Verdict, k)}, nil
}

// checkBlock checks that blocks (indexed by delta, nil where want[k] is false) continue the
// current pass at lo and returns the block length.
func (s *Screening) checkBlock(op string, lo int, blocks [][]float32, want func(k int) bool) (int, error) {
	if len(blocks) != s.k {
		return 0, fmt.Errorf("%s: %w: %d blocks for %d deltas", op, ErrLengthMismatch, len(blocks), s.k)
	}
	if lo != s.pos {
		return 0, fmt.Errorf("%s: %w: block starts at %d, expected %d", op, ErrBadOption, lo, s.pos)
	}
	if lo%parallel.ChunkLen != 0 {
		return 0, fmt.Errorf("%s: %w: block start %d is not a multiple of %d", op, ErrBadOption, lo, parallel.ChunkLen)
	}
	m := -1
	for k, b := range blocks {
		if !want(k) {
			continue
		}
		if m < 0 {
			m = len(b)
		}
		if len(b) != m {
			return 0, fmt.Errorf("%s: %w: block of delta %d has %d values, others %d", op, ErrLengthMismatch, k, len(b), m)
		}
	}
	if m < 0 {
		m = 0
	}
	if lo+m > s.n {
		return 0, fmt.Errorf("%s: %w: block [%d, %d) past %d values", op, ErrLengthMismatch, lo, lo+m, s.n)
	}
	return m, nil
}

// AddNorms feeds values [lo, lo+len(blocks[k])) of every delta to the first pass.
func (s *Screening) AddNorms(lo int, blocks [][]float32) error {
	if s.decided {
		return fmt.Errorf("screen norms: %w: pass already complete", ErrBadOption)
	}
	m, err := s.checkBlock("screen norms", lo, blocks, func(int) bool { return true })
	if err != nil {
		return err
	}
	chunks := parallel.NumChunks(m, parallel.ChunkLen)
	partials := make([]float64, chunks*s.k)
	parallel.ForChunks(m, parallel.ChunkLen, s.workers, func(c, a, b int) {
		for k, x := range blocks {
			partials[c*s.k+k] = sumSquares(x[a:b])
		}
	})
	for c := range chunks {
		for k := range s.k {
			s.sumsq[k] += partials[c*s.k+k]
		}
	}
	s.pos += m
	if s.pos == s.n {
		s.decideNorms()
	}
	return nil
}

func (s *Screening) decideNorms() {
	s.decided = true
	for k := range s.k {
		n := math.Sqrt(s.sumsq[k])
		s.verdicts[k] = Verdict{Accepted: true, Norm: n, Bar: math.NaN()}
		switch {
		case math.IsNaN(n) || math.IsInf(n, 0):
			s.verdicts[k].reject(ReasonNonFinite)
		case s.cfg.MaxNorm > 0 && n > s.cfg.MaxNorm:
			s.verdicts[k].reject(ReasonNormBound)
		default:
			s.alive = append(s.alive, k)
		}
	}
	if s.trusted {
		// Norms and directions are judged against the reference alone, in the second pass.
		s.refCheck = true
		s.startCosines()
		return
	}
	relative := len(s.alive) >= MinRelativeCohort
	if s.cfg.MaxNormRatio > 0 {
		limit := math.Inf(1)
		if relative {
			norms := make([]float64, len(s.alive))
			for j, k := range s.alive {
				norms[j] = s.verdicts[k].Norm
			}
			slices.Sort(norms)
			limit = s.cfg.MaxNormRatio * medianSorted(norms)
		} else {
			if s.hist.Rounds > 0 && s.hist.Norm > 0 {
				// Even one round's median accepted norm is a yardstick within a factor
				// MaxNormRatio: a small cohort early in a run is not left without one.
				limit = s.cfg.MaxNormRatio * s.hist.Norm
			}
			if len(s.alive) == 2 {
				// A pair: the larger is odd when it exceeds MaxNormRatio × the smaller (the
				// smaller can do little harm either way).
				a, b := s.verdicts[s.alive[0]].Norm, s.verdicts[s.alive[1]].Norm
				if lo := min(a, b); lo > 0 {
					limit = min(limit, s.cfg.MaxNormRatio*lo)
				}
			}
		}
		s.alive = slices.DeleteFunc(s.alive, func(k int) bool {
			if s.verdicts[k].Norm > limit {
				s.verdicts[k].reject(ReasonNormOutlier)
				return true
			}
			return false
		})
	}
	if s.cfg.MinCosine == nil {
		return
	}
	s.cohort = len(s.alive) >= MinRelativeCohort
	// A small cohort is held to the reference only once the history is warm (its calibrated
	// bar has learnt how far honest updates turn from the momentum): early honest updates
	// and a solo node's oscillating lone update can point away from the momentum, and the
	// fixed bar would reject them at every attempt (docs/design-notes.md). Until then a
	// pair is held to each other.
	//
	// A cohort is held to the reference as well once the history is warm: the reference
	// is made of merged updates only, so attackers who agree with each other (a third of
	// the cohort sending sign flips pulls the others' sum U towards them) cannot pull it.
	// With nine digits trainers the honest updates' cosines to the momentum stayed between
	// 0.14 and 0.46 for the whole run while their cosines to the others fell to −0.12.
	s.refCheck = s.hasRef && s.hist.Ref.N >= HistoryWarmup
	// A pair is held to each other when there is no usable reference (decided once the
	// reference's norm is known), so U is summed for it too.
	s.pair = len(s.alive) == 2
	s.startCosines()
}

// startCosines prepares the second pass over the survivors of the first.
func (s *Screening) startCosines() {
	s.pos = 0
	s.inv = make([]float32, s.k)
	for _, k := range s.alive {
		if n := s.verdicts[k].Norm; n > 0 {
			s.inv[k] = float32(1 / n)
		}
	}
	s.dotU, s.dotR = make([]float64, s.k), make([]float64, s.k)
}

// SetProbation marks the deltas (one flag per delta, in input order) whose senders are on
// probation: peers the chain has not merged often enough recently to trust (new ones, and
// ones back from quarantine). Once the history is warm, the cosine bars a delta on
// probation is held to, to the others and to the momentum, are never below the floor
// max(*MinCosine, noise bar), whatever the calibrated bars say, wherever honest updates
// clear that floor by far (this round's median cohort cosine for the bar to the others,
// the history's mean cosine to the momentum for the bar to the momentum, at least twice
// the floor): a delta of a peer that has not earned trust must point along the others and
// the momentum better than a random direction does. The
// calibrated bar of a converging run can fall far below zero (the digits process rows:
// −0.45 at round 11, when three attackers came back from quarantine and their sign flips
// and noise were merged). Call it before the cosine pass completes; nil clears it.
func (s *Screening) SetProbation(p []bool) (err error) {
	s.probation, err = s.deltaFlags("probation", p)
	return err
}

func (s *Screening) onProbation(k int) bool { return s.probation != nil && s.probation[k] }

// SetSole marks the deltas of the only peer the recent chain merged: the swarm has had one
// trainer. In a round of one or two updates such a delta is not held to the momentum. Its
// cosine to the momentum is mostly its base's: an honest update that points back along the
// last steps (charlm, one node at outer lr 1: cosines of −0.05 to −0.06 from round 8 on,
// against a floor of 0.007) is rejected on every retry on that base, and with no other
// trainer to merge the run stalls for good. With others merged recently the delta is
// judged as any other, so an epoch's tail in a swarm still rejects a lone sign flip. In a
// cohort it is judged as any other too. Call it before the cosine pass completes; nil
// clears it.
func (s *Screening) SetSole(p []bool) (err error) {
	s.sole, err = s.deltaFlags("sole", p)
	return err
}

func (s *Screening) isSole(k int) bool { return s.sole != nil && s.sole[k] }

// SetTrusted says that the reference vector AddCosines is given is the validator's own
// update (a short window it trained on the round's base, on data it sampled itself), not
// the merged updates: a yardstick no trainer sets, however many of the cohort attack and
// whoever was merged before (FLTrust's server update). Screening then judges every delta by
// the reference alone, whatever the cohort's size: its norm against MaxNormRatio × the
// reference's norm (ReasonNormOutlier), its cosine to the reference against the bar from
// the history of cosines to it (ReasonLowCosine; the floor max(*MinCosine, noise bar) until
// the history is warm, see bar; *MinCosine counts as 0 when unset). The cohort's median
// norm, its cosines to each other and SetSole play no part: half a cohort attacking sets
// the first two, and the first trainer in a young chain the last. Call it before the
// first pass completes; it needs hasRef.
func (s *Screening) SetTrusted() error {
	if !s.hasRef {
		return fmt.Errorf("screen trusted: %w: no reference vector", ErrBadOption)
	}
	if s.decided {
		return fmt.Errorf("screen trusted: %w: norm pass already complete", ErrBadOption)
	}
	s.trusted = true
	return nil
}

// SetPrevious says that the cosine pass brings, beside this round's trusted reference, the
// reference the base was screened with (AddCosinesWithPrevious); call it after SetTrusted.
// Their cosine, two validator windows on consecutive bases, shows how far apart honest
// windows are that no trainer trained (History.Self), and sets the least bar against the
// reference once it is known (History.selfLimit): while some update of the round clears
// the floor, the bar is never below the lower of that limit and the floor. The calibrated
// bar learns from merged updates, so updates that turn away from the reference a little
// further each round lower it round by round — half a cohort did, to a bar of −0.5,
// while the references' own cosine stayed between 0.25 and 0.41 (docs/security.md); the
// limit does not follow them.
func (s *Screening) SetPrevious() error {
	if !s.trusted {
		return fmt.Errorf("screen: %w: the base's reference without a trusted reference", ErrBadOption)
	}
	s.previous = true
	return nil
}

// SelfCosine is the cosine of this round's reference to the base's (SetPrevious), once
// the cosine pass is complete; NaN without it.
func (s *Screening) SelfCosine() float64 {
	if !s.previous || !s.finished || s.pp == 0 || s.rr == 0 {
		return math.NaN()
	}
	return cosineOf(s.dotP, s.pp, s.rr)
}

// SelfLimit is the least bar the references set this round (SetPrevious, before the
// floor caps it), once the cosine pass is complete; NaN while their history is young or
// without the base's reference.
func (s *Screening) SelfLimit() float64 {
	l := s.hist.selfLimit(s.SelfCosine())
	if math.IsInf(l, -1) {
		return math.NaN()
	}
	return l
}

// minCosine is *MinCosine, or 0 when the cosine check is off (a trusted reference judges
// direction even so).
func (s *Screening) minCosine() float64 {
	if s.cfg.MinCosine == nil {
		return 0
	}
	return *s.cfg.MinCosine
}

// deltaFlags checks one flag per delta (nil for none), set before the cosine pass
// completes, and copies them.
func (s *Screening) deltaFlags(what string, p []bool) ([]bool, error) {
	if p != nil && len(p) != s.k {
		return nil, fmt.Errorf("screen %s: %w: %d flags for %d deltas", what, ErrLengthMismatch, len(p), s.k)
	}
	if s.finished {
		return nil, fmt.Errorf("screen %s: %w: cosine pass already complete", what, ErrBadOption)
	}
	return slices.Clone(p), nil
}

// NeedsCosines reports, once the first pass is complete, whether a second pass
// (AddCosines) is needed.
func (s *Screening) NeedsCosines() bool {
	return s.decided && len(s.alive) > 0 && (s.trusted || s.cfg.MinCosine != nil && (s.cohort || s.pair || s.hasRef))
}

// Active returns the deltas that survived the norm checks, in input order: the second pass
// needs blocks of these only.
func (s *Screening) Active() []int { return slices.Clone(s.alive) }

// AddCosines feeds values [lo, lo+m) to the second pass: blocks[k] for every k in Active
// (others may be nil) and ref[lo:lo+m] of the reference vector (nil if there is none).
func (s *Screening) AddCosines(lo int, blocks [][]float32, ref []float32) error {
	return s.AddCosinesWithPrevious(lo, blocks, ref, nil)
}

// AddCosinesWithPrevious is AddCosines with prev[lo:lo+m] of the base's reference, which
// SetPrevious asks for (nil otherwise).
func (s *Screening) AddCosinesWithPrevious(lo int, blocks [][]float32, ref, prev []float32) error {
	if !s.NeedsCosines() {
		return fmt.Errorf("screen cosines: %w: no second pass needed", ErrBadOption)
	}
	if s.finished {
		return fmt.Errorf("screen cosines: %w: pass already complete", ErrBadOption)
	}
	active := make([]bool, s.k)
	for _, k := range s.alive {
		active[k] = true
	}
	m, err := s.checkBlock("screen cosines", lo, blocks, func(k int) bool { return active[k] })
	if err != nil {
		return err
	}
	if s.hasRef && len(ref) != m {
		return fmt.Errorf("screen cosines: %w: reference block has %d values, deltas %d", ErrLengthMismatch, len(ref), m)
	}
	if s.previous && len(prev) != m {
		return fmt.Errorf("screen cosines: %w: the base's reference block has %d values, deltas %d", ErrLengthMismatch, len(prev), m)
	}
	sumU := s.cohort || s.pair
	if sumU {
		if cap(s.unit) < m {
			s.unit = make([]float32, m)
		}
		s.unit = s.unit[:m]
	}
	chunks := parallel.NumChunks(m, parallel.ChunkLen)
	const slots = 2 // per delta: dot with U, dot with ref
	per := slots*s.k + 4
	partials := make([]float64, chunks*per)
	parallel.ForChunks(m, parallel.ChunkLen, s.workers, func(c, a, b int) {
		p := partials[c*per : (c+1)*per]
		if sumU {
			u := s.unit[a:b]
			// U = Σ_k float32(d_k·inv_k), added in k order in float32.
			for j, k := range s.alive {
				x, w := blocks[k][a:b], s.inv[k]
				x = x[:len(u)]
				if j == 0 {
					for i := range u {
						u[i] = float32(x[i] * w)
					}
					continue
				}
				for i := range u {
					u[i] = u[i] + float32(x[i]*w)
				}
			}
			for _, k := range s.alive {
				p[slots*k] = dotLanes(blocks[k][a:b], u)
			}
			p[slots*s.k] = sumSquares(u)
		}
		if s.hasRef {
			r := ref[a:b]
			for _, k := range s.alive {
				p[slots*k+1] = dotLanes(blocks[k][a:b], r)
			}
			p[slots*s.k+1] = sumSquares(r)
			if s.previous {
				q := prev[a:b]
				p[slots*s.k+2] = dotLanes(q, r)
				p[slots*s.k+3] = sumSquares(q)
			}
		}
	})
	for c := range chunks {
		p := partials[c*per : (c+1)*per]
		for _, k := range s.alive {
			s.dotU[k] += p[slots*k]
			s.dotR[k] += p[slots*k+1]
		}
		s.uu += p[slots*s.k]
		s.rr += p[slots*s.k+1]
		s.dotP += p[slots*s.k+2]
		s.pp += p[slots*s.k+3]
	}
	s.pos += m
	if s.pos == s.n {
		s.decideCosines()
	}
	return nil
}

func (s *Screening) decideCosines() {
	s.finished = true
	if s.trusted {
		s.decideTrusted()
		return
	}
	// A zero reference (no merged update yet to point along) says nothing.
	refCheck := s.refCheck && s.rr > 0
	pairCheck := s.pair && !s.cohort && !refCheck
	if s.cohort {
		for _, k := range s.alive {
			s.verdicts[k].Cosine = s.cohortCosine(k)
		}
	}
	if s.hasRef {
		for _, k := range s.alive {
			v := &s.verdicts[k]
			v.RefCosine, v.refRan = cosineOf(s.dotR[k], s.sumsq[k], s.rr), true
		}
	}
	median := s.roundMedian()
	floor := max(*s.cfg.MinCosine, NoiseBar(s.n))
	// A cohort's bars are never above half of this round's median cosine (an honest
	// update's, with fewer than half of the cohort odd), unless that is below the floor: the
	// calibrated bars learn from merged updates only, so when honest cosines fall faster
	// than they follow, every update of the round fails them on every retry on its base.
	cohortBar := atMostHalf(s.bar(s.hist.Cohort, median), median, floor)
	refBar := s.bar(s.hist.Ref, math.NaN())
	if s.cohort && s.hasRef {
		refBar = atMostHalf(refBar, s.survivorsMedian(func(v *Verdict) float64 { return v.RefCosine }), floor)
	}
	// Probation holds a delta to the floor only where honest updates clear it by far, at
	// least twice (as for the cold bar): for the bar to the others, this round's median
	// cohort cosine (an honest update's, with fewer than half of the cohort odd); for the
	// bar to the momentum, the mean accepted cosine to the momentum of recent rounds. Where honest updates look like noise
	// (digits with nine trainers, once converged: each round's lowest accepted cosine to the
	// others −0.16 to −0.43 from round 49 on), a floor would lock honest newcomers out.
	cohortProbation := s.hist.Cohort.N >= HistoryWarmup && median/2 >= floor
	refProbation := s.hist.Ref.Mean/2 >= floor
	for _, k := range s.alive {
		v := &s.verdicts[k]
		if pairCheck {
			v.Cosine = s.cohortCosine(k)
		}
		switch {
		case s.cohort:
			v.Bar, v.cohortRan = cohortBar, true
			rb := refBar
			if s.onProbation(k) {
				// Both checks: three sign flips agree with each other, and where honest
				// updates agree weakly a flip's cosine to the others can clear the floor
				// (the digits process row at round 11: a merged flip at 0.02 to the others,
				// −0.29 to the momentum).
				if cohortProbation {
					v.Bar = max(v.Bar, floor)
				}
				if refProbation {
					rb = max(rb, floor)
				}
			}
			if v.Cosine >= v.Bar && refCheck && v.RefCosine < rb {
				v.Bar = rb
				v.reject(ReasonLowCosine)
			}
		case refCheck:
			// A round of one or two updates is never held above the floor. The cosine of
			// a lone update to the momentum is mostly its base's: rejected once, it is
			// rejected on every retry on that base, and a calibrated bar learns from
			// merged updates only, so when honest cosines fall faster than it follows, it
			// locks a lone trainer out for good (digits, one node: a history mean of 0.48,
			// then cosines of 0.08–0.17 from round 8 on, bar 0.208, 14 retries
			// rejected). Above the floor an update points along the momentum better than
			// noise does, so the floor still rejects noise and sign flips where honest
			// updates clear it.
			if s.isSole(k) {
				continue // the swarm's only trainer (SetSole)
			}
			v.Bar = min(refBar, floor)
			if s.onProbation(k) && refProbation {
				v.Bar = max(v.Bar, floor)
			}
		case pairCheck:
			// Two updates and nothing else to compare them to: neither can be told odd,
			// so when they disagree both are rejected (the fixed bar; the history's
			// cohort statistics are of cosines to several others, not to one).
			v.Bar = *s.cfg.MinCosine
		default:
			continue
		}
		c := v.Cosine
		if refCheck && !s.cohort {
			c = v.RefCosine
		}
		if c < v.Bar {
			v.reject(ReasonLowCosine)
		}
	}
}

// decideTrusted judges each survivor against the trusted reference (SetTrusted): norm,
// then cosine. A zero reference (a window that did not move the model) says nothing, and
// only the absolute checks of the first pass stand.
func (s *Screening) decideTrusted() {
	refNorm := math.Sqrt(s.rr)
	if math.IsNaN(refNorm) || math.IsInf(refNorm, 0) {
		// A broken reference judges nothing in anyone's favour.
		for _, k := range s.alive {
			s.verdicts[k].Trusted = true
			s.verdicts[k].reject(ReasonLowCosine)
		}
		s.alive = nil
		return
	}
	if refNorm == 0 {
		return
	}
	floor := max(s.minCosine(), NoiseBar(s.n))
	var fit []int
	for _, k := range s.alive {
		v := &s.verdicts[k]
		v.Trusted, v.RefNorm = true, refNorm
		v.RefCosine, v.refRan = cosineOf(s.dotR[k], s.sumsq[k], s.rr), true
		if s.cfg.MaxNormRatio > 0 && v.Norm > s.cfg.MaxNormRatio*refNorm {
			v.reject(ReasonNormOutlier)
			continue
		}
		fit = append(fit, k)
	}
	s.alive = fit
	if len(fit) == 0 {
		return
	}
	// The calibrated bar is never above half of this round's median cosine to the
	// reference, unless that is below the floor: it learns from merged updates only, and
	// when honest cosines fall faster than it follows it rejects them on every retry on the
	// base (docs/design-notes.md). However many attack, they can lower the bar to the floor this way, not raise it.
	bar := atMostHalf(s.bar(s.hist.Ref, math.Inf(1)), s.survivorsMedian(func(v *Verdict) float64 { return v.RefCosine }), floor)
	// When no update of the round points along the reference better than noise does, the
	// floor holds no one: honest windows and the reference (one window on a small sample)
	// can both be mostly noise, and a floor every update fails fails on every retry on the
	// base, so the round never closes. The bar is then at most 0: what points away from the reference is still
	// rejected, a sign flip of an honest update among it.
	top := math.Inf(-1)
	for _, k := range fit {
		top = max(top, s.verdicts[k].RefCosine)
	}
	// A peer on probation is held to half the mean cosine the merged updates have shown to
	// the reference, and to half the round's best (attackers can raise that, not lower
	// it), never above the floor.
	hold := min(floor, s.hist.Ref.Mean/2, top/2)
	clear := top >= floor
	if !clear {
		bar = min(bar, 0)
	} else {
		// Never below what honest windows no trainer trained have shown (SetPrevious), up
		// to the floor, which the round's best update clears.
		bar = max(bar, min(s.hist.selfLimit(s.SelfCosine()), floor))
	}
	for _, k := range fit {
		v := &s.verdicts[k]
		v.Bar = bar
		if s.onProbation(k) {
			// A peer the chain has not merged often enough to trust must point along the
			// validator's own window, which attackers cannot move: once honest cosines fall
			// toward noise the calibrated bar falls below zero, where a sign flip of an
			// honest update passes it, and noise half the time. Held to at least 0 and to
			// hold, which the round's best update clears when it points along the reference
			// at all: a round whose every update is on probation closes then; where every
			// update points away (noise-like windows), each retry brings new windows.
			v.Bar = max(v.Bar, 0, hold)
		}
		if !(v.RefCosine >= v.Bar) {
			v.reject(ReasonLowCosine)
		}
	}
	s.alive = slices.DeleteFunc(s.alive, func(k int) bool { return !s.verdicts[k].Accepted })
}

// atMostHalf lowers bar to half of median, or to floor if that is higher; a NaN median
// (no cohort) leaves it.
func atMostHalf(bar, median, floor float64) float64 {
	if math.IsNaN(median) {
		return bar
	}
	return min(bar, max(median/2, floor))
}

// cohortCosine is u_k·(U − u_k) / ‖U − u_k‖ with u_k·u_k taken as 1: the cosine of
// survivor k to the sum of the other survivors' unit vectors (for a pair, to the other one).
func (s *Screening) cohortCosine(k int) float64 {
	w := float64(s.inv[k])
	du := float64(w * s.dotU[k])
	rest := s.uu - float64(2*du) + 1
	if w == 0 || !(rest > 0) {
		return 0
	}
	return (du - 1) / math.Sqrt(rest)
}

// roundMedian is the median cohort cosine of this round's survivors (NaN without a cohort
// check): how well this round's updates agree, for the cold bar. With fewer than half of
// the cohort odd, it is an honest update's cosine.
func (s *Screening) roundMedian() float64 {
	if !s.cohort {
		return math.NaN()
	}
	return s.survivorsMedian(func(v *Verdict) float64 { return v.Cosine })
}

// survivorsMedian is the median of one cosine of the survivors' verdicts (at least one).
func (s *Screening) survivorsMedian(cosine func(*Verdict) float64) float64 {
	cs := make([]float64, 0, len(s.alive))
	for _, k := range s.alive {
		cs = append(cs, cosine(&s.verdicts[k]))
	}
	slices.Sort(cs)
	return medianSorted(cs)
}

// bar is the cosine bar from history m. While the history is cold (or CosineTolerance is
// 0) it is the fixed *MinCosine, raised to the noise bar NoiseZ/√n when this round's
// updates clearly agree (their median cosine, round, is at least twice the noise bar): a
// delta whose cosine is below the noise bar points no more along the others than a random
// direction does, so noise at an honest norm is rejected even with min_cosine 0, while a
// run whose honest updates look like noise from the start is not stopped by it. The
// reference check uses the cold bar too while the history is cold: at the start of a run
// a small cohort (attackers screened out by norm leave one or two survivors) would
// otherwise merge noise or a sign flip at an honest norm, since nothing else judges its
// direction.
//
// Once warm, the calibrated bar is mean − CosineTolerance × spread of the cosines
// accepted in recent rounds, and never above half the mean. The spread is the history's
// pulled toward PriorSpread, as if PriorRounds rounds of it came first, and at least
// MinSpread (Moments.calSpread): a history of five or six rounds can be far tighter than
// the honest updates are over a run, and a lone update rejected on a base is rejected on
// every retry on it, so the round never closes. The floor test below uses the history's
// spread as it stands (at least MinSpread). The bar is never above half the mean: when honest
// updates agree closely the spread is tiny, and a bar just below the mean would reject
// honest updates as soon as training moves on faster than the history follows. While the
// accepted cosines clear the floor max(*MinCosine, noise bar) by FloorZ spreads (mean −
// FloorZ × spread ≥ floor), the calibrated bar is raised to the floor if it is below:
// honest updates point along their reference clearly better than noise, so the floor
// costs them under 1 %, while a calibrated bar that fell below zero (the spread of a
// history that followed the run from cosines of 0.8 down to 0.3) let through a sign flip
// (cosine about −mean) and noise (about 0). When honest updates agree less than that
// (digits with three trainers: cosines to the others of 0.0–0.4 after convergence, to the
// momentum −0.2–0.4), they cannot be told from noise by direction without rejecting
// honest ones, and the calibrated bar stands alone.
func (s *Screening) bar(m Moments, round float64) float64 {
	floor := max(s.minCosine(), NoiseBar(s.n))
	if s.cfg.CosineTolerance > 0 && m.N >= HistoryWarmup {
		cal := min(m.Mean-float64(s.cfg.CosineTolerance*m.calSpread()), m.Mean/2)
		if m.Mean-float64(FloorZ*max(math.Sqrt(m.Var), MinSpread)) >= floor {
			return max(cal, floor)
		}
		return cal
	}
	if round/2 >= floor {
		return floor
	}
	return s.minCosine()
}

// NoiseBar is the cosine that a random direction in n dimensions exceeds with probability
// about 3·10⁻⁵: NoiseZ/√n, at most MaxNoiseBar (0 for n = 0).
func NoiseBar(n int) float64 {
	if n <= 0 {
		return 0
	}
	return min(float64(NoiseZ)/math.Sqrt(float64(n)), MaxNoiseBar)
}

// Verdicts returns one verdict per delta, in input order, once the passes are complete.
func (s *Screening) Verdicts() ([]Verdict, error) {
	if !s.decided || (s.NeedsCosines() && !s.finished) {
		return nil, fmt.Errorf("screen: %w: verdicts asked for before the passes are complete", ErrBadOption)
	}
	return slices.Clone(s.verdicts), nil
}
