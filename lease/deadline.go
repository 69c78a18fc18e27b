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
	// Missed is the longest deadline of the round's earlier attempts that this trainer —
	// the same process, heard from all along — let pass with nothing delivered; 0 if none.
	// The deadline is then at least twice it: the pace it was given is too short for the
	// trainer as it runs now (a workload slower than the first-deadline guess, a machine
	// loaded since its pace was observed idle), and at the same deadline its windows would
	// run past it attempt after attempt. A trainer that was killed or restarted, or trained
	// another validator's lease first, missed nothing this way: its silence says nothing of
	// the deadline.
	Missed time.Duration
}

// Timing bounds an attempt's deadline.
type Timing struct {
	Floor, Ceiling time.Duration
	// Unknown is the deadline when no leased trainer's pace is known at all (round 1 of a
	// fresh experiment, trainers that have announced no speed): a short default instead
	// of Ceiling, so that a trainer lost in that attempt costs Unknown, not the whole
	// round timeout. 0 means Ceiling.
	Unknown time.Duration
}

// Deadline is how long an attempt may run: three times the slowest expected window (steps
// × the trainer's seconds per step — observed, else announced, else the median of the
// known paces), plus slack for fetching and merging; with no pace known for any trainer it
// is t.Unknown. It is at least twice any deadline a leased trainer missed in the round
// (Pace.Missed), and between t.Floor and t.Ceiling. So a fleet of mixed speeds needs no
// hand-tuned timeout, a dead trainer holds a round up for a few windows, not for
// round_timeout, and a workload or machine slower than its pace still gets its window
// through.
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
	var missed time.Duration
	for _, p := range paces {
		missed = max(missed, p.Missed)
	}
	// Twice what was missed, without overflowing past the ceiling.
	least := min(t.Ceiling, missed) * 2
	if least > t.Ceiling || least < 0 {
		least = t.Ceiling
	}
	if len(seen) == 0 {
		if t.Unknown <= 0 {
			return t.Ceiling
		}
		return min(t.Ceiling, max(t.Floor, t.Unknown, least))
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
	return max(t.Floor, least, time.Duration(secs*float64(time.Second)))
}

func usable(x float64) bool { return x > 0 && !math.IsInf(x, 0) && !math.IsNaN(x) }
