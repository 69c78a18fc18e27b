package lease

import (
	"slices"
	"time"
)

// Pace is what a validator has observed of one trainer: seconds per inner step over its
// recent windows (0 when it has not contributed yet).
type Pace struct {
	Peer           string
	SecondsPerStep float64
	Steps          int
}

// Deadline is how long a round may run: three times the slowest expected window (steps ×
// the trainer's observed seconds per step; a trainer never seen uses the median pace of
// those seen), plus slack for fetching and merging, between floor and ceiling. With no
// observations at all it is ceiling. So a fleet of mixed speeds needs no hand-tuned
// timeout, and a dead trainer holds a round up for a few windows, not for round_timeout.
func Deadline(paces []Pace, floor, ceiling time.Duration) time.Duration {
	var seen []float64
	for _, p := range paces {
		if p.SecondsPerStep > 0 {
			seen = append(seen, p.SecondsPerStep)
		}
	}
	if len(seen) == 0 {
		return ceiling
	}
	slices.Sort(seen)
	median := seen[len(seen)/2]
	var slowest float64
	for _, p := range paces {
		pace := p.SecondsPerStep
		if pace <= 0 {
			pace = median
		}
		slowest = max(slowest, pace*float64(p.Steps))
	}
	d := time.Duration(3*slowest*float64(time.Second)) + 2*time.Second
	return min(ceiling, max(floor, d))
}
