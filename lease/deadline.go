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
	// Expired counts the round's earlier attempts that expired with no contribution: each
	// doubles the deadline (up to Ceiling), whether it came from Unknown or from known
	// paces. So a workload slower than the default still gets its first window through, and
	// so does a fleet slowed down since its paces were observed (a machine under load):
	// with the deadline of its idle paces every window would run past it, attempt after
	// attempt, for as long as the load lasted.
	Expired int
}

// Deadline is how long an attempt may run: three times the slowest expected window (steps
// × the trainer's seconds per step — observed, else announced, else the median of the
// known paces), plus slack for fetching and merging; with no pace known for any trainer it
// is t.Unknown. Either is doubled per expired attempt (t.Expired) and kept between t.Floor
// and t.Ceiling. So a fleet of mixed speeds needs no hand-tuned timeout, and a dead trainer
// holds a round up for a few windows, not for round_timeout.
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
		if t.Unknown <= 0 {
			return t.Ceiling
		}
		return t.stretch(t.Unknown)
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
	return t.stretch(time.Duration(secs * float64(time.Second)))
}

// stretch doubles d once per expired attempt and keeps it between Floor and Ceiling.
func (t Timing) stretch(d time.Duration) time.Duration {
	for i := 0; i < t.Expired && d < t.Ceiling; i++ {
		d *= 2
	}
	return min(t.Ceiling, max(t.Floor, d))
}

func usable(x float64) bool { return x > 0 && !math.IsInf(x, 0) && !math.IsNaN(x) }
