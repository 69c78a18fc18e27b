package lease

import (
	"math"
	"math/bits"
)

// WindowSize is what sizing a trainer's share to its window needs to know.
type WindowSize struct {
	// PerTrainer is lease.microshards_per_trainer: the share when the rule needs no more.
	PerTrainer int
	// InnerSteps × SamplesPerStep is a window's samples (protocol.inner_steps times the
	// workload's batch size); 0 for either: unknown.
	InnerSteps, SamplesPerStep int
	// Shards and Examples are the plan's microshards and the examples they hold (the
	// dataset manifest's counts); 0 for either: unknown.
	Shards   int
	Examples int64
	// Trainers is how many trainers the round leases to (at least 1 is assumed).
	Trainers int
}

// Window is WindowShare's answer.
type Window struct {
	// Share is the microshards a trainer of average speed is leased: Assign's and
	// WindowSteps' perTrainer.
	Share int
	// Need is the microshards one window reads without repeating an example: the plan's
	// average examples per microshard into InnerSteps × SamplesPerStep, rounded up; 0 when
	// something it depends on is unknown.
	Need int
}

// Repeats reports whether a full share still holds fewer examples than a window reads, so
// each window loops over its data (Need/Share times on average).
func (w Window) Repeats() bool { return w.Need > w.Share }

// WindowShare sizes a trainer's lease so that one window of InnerSteps × SamplesPerStep
// samples reads each leased example at most once: the share is
//
//	max(PerTrainer, ceil(InnerSteps × SamplesPerStep × Shards / Examples))
//
// as long as the plan holds that many for every trainer (Need × Trainers ≤ Shards). Where
// it does not (a small dataset, a large fleet or long windows), the share stays
// PerTrainer and the windows repeat their examples: raising every lease to an even split
// of the epoch instead hands a two-trainer fleet half the data each round, and once the
// model has converged two such updates point apart, so the cohort screen rejects both and
// the run stalls (docs/design-notes.md). With anything unknown,
// the share is PerTrainer and Need is 0.
//
// The rule sizes whole shares, not the epoch's tail: a leftover of up to half a round goes
// with the last full round (AbsorbTail), and where fewer microshards are left than the
// shares ask for, AssignWithin scales them down and WindowSteps shrinks those trainers'
// steps against Share, so a tail window does not repeat its data either.
// The arithmetic is on integers: every validator computes the same share from the same
// inputs.
func WindowShare(s WindowSize) Window {
	w := Window{Share: s.PerTrainer}
	if s.InnerSteps <= 0 || s.SamplesPerStep <= 0 || s.Shards <= 0 || s.Examples <= 0 {
		return w
	}
	// Each factor is capped below 2^31, so their product fits 64 bits; the product with
	// Shards may not, hence the 128-bit multiply and divide.
	window := uint64(min(s.InnerSteps, math.MaxInt32)) * uint64(min(s.SamplesPerStep, math.MaxInt32))
	hi, lo := bits.Mul64(window, uint64(s.Shards))
	if hi >= uint64(s.Examples) {
		w.Need = math.MaxInt32 // the quotient does not fit 64 bits: more than any plan holds
		return w
	}
	q, r := bits.Div64(hi, lo, uint64(s.Examples))
	if r > 0 {
		q++
	}
	w.Need = int(min(q, math.MaxInt32))
	if w.Need <= s.PerTrainer {
		return w
	}
	if w.Need > MaxLeaseMicroshards || uint64(w.Need)*uint64(max(s.Trainers, 1)) > uint64(s.Shards) {
		return w
	}
	w.Share = w.Need
	return w
}
