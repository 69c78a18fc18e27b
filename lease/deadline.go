package lease

import (
	"math"
	"slices"
	"time"
)

// Pace is what is known of one leased trainer's speed, in seconds per inner step: what this
// validator observed over the trainer's recent windows, and what the trainer announces of
// itself (its worker's probe, then its own windows); 0 where nothing is known.
type Pace struct {
	Peer           string
	SecondsPerStep float64 // observed by the validator
	Steps          int
	// Announced is the trainer's own figure. It counts only where nothing was observed: a
	// trainer that claims to be fast shortens only its own term of the deadline (the
	// slowest term wins), one that claims to be slow can stretch it no further than the
	// ceiling, and the first window it delivers replaces the claim with an observation.
	Announced float64
}

// Timing bounds an attempt's deadline.
type Timing struct {
	Floor, Ceiling time.Duration
	// Unknown is the deadline when no leased trainer's pace is known at all (round 1 of a
	// fresh experiment, trainers that have announced no speed): a short default instead
	// of Ceiling, so that a trainer lost in that attempt costs Unknown, not the whole
	// round timeout. 0 means Ceiling.
	Unknown time.Duration
	// Blind counts the round's earlier attempts that were leased with no pace known and
	// expired with no contribution: each doubles Unknown (up to Ceiling), so a workload
	// slower than the default still gets its first window through.
	Blind int
}

// Deadline is how long an attempt may run: three times the slowest expected window (steps
// × the trainer's seconds per step — observed, else announced, else the median of the
// known paces), plus slack for fetching and merging, between t.Floor and t.Ceiling. With no
// pace known for any trainer it is t.Unknown (doubled per blind attempt). So a fleet of
// mixed speeds needs no hand-tuned timeout, and a dead trainer holds a round up for a few
// windows, not for round_timeout.
func Deadline(paces []Pace, t Timing) time.Duration {
	known := func(p Pace) float64 {
		switch {
		case usable(p.SecondsPerStep):
			return p.SecondsPerStep
		case usable(p.Announced):
			return p.Announced
		}
		return 0
	}
	var seen []float64
	for _, p := range paces {
		if s := known(p); s > 0 {
			seen = append(seen, s)
		}
	}
	if len(seen) == 0 {
		d := t.Unknown
		if d <= 0 {
			return t.Ceiling
		}
		for i := 0; i < t.Blind && d < t.Ceiling; i++ {
			d *= 2
		}
		return min(t.Ceiling, max(t.Floor, d))
	}
	slices.Sort(seen)
	median := seen[len(seen)/2]
	var slowest float64
	for _, p := range paces {
		pace := known(p)
		if pace <= 0 {
			pace = median
		}
		slowest = max(slowest, pace*float64(p.Steps))
	}
	secs := 3*slowest + 2
	if secs >= t.Ceiling.Seconds() { // also keeps the conversion below from overflowing
		return t.Ceiling
	}
	return max(t.Floor, time.Duration(secs*float64(time.Second)))
}

// PaceKnown reports whether any trainer's pace is known (observed or announced): without
// one, Deadline falls back to Timing.Unknown.
func PaceKnown(paces []Pace) bool {
	for _, p := range paces {
		if usable(p.SecondsPerStep) || usable(p.Announced) {
			return true
		}
	}
	return false
}

func usable(x float64) bool { return x > 0 && !math.IsInf(x, 0) && !math.IsNaN(x) }
