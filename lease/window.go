package lease

import (
	"math"
	"math/bits"
	"slices"
)

// WindowShare is how many microshards a trainer of average capacity is leased: at least
// perTrainer (lease.microshards_per_trainer), and enough that one window of innerSteps ×
// samplesPerStep samples does not read its examples more than once. A plan's microshards
// hold examples/shards examples on average (the dataset manifest's counts, which the
// workload writes in examples.json), so the window needs
//
//	ceil(innerSteps × samplesPerStep × shards / examples)
//
// of them; at most MaxLeaseMicroshards. With anything unknown (samplesPerStep, shards or
// examples 0) it is perTrainer. The arithmetic is on integers, so every validator computes
// the same share from the same inputs. Assign and TailSteps take the result as their
// perTrainer: where an epoch's tail leaves too few microshards, trainers get fewer and
// their steps shrink in proportion, so a window never repeats its data there either.
func WindowShare(perTrainer, innerSteps, samplesPerStep, shards int, examples int64) int {
	if innerSteps <= 0 || samplesPerStep <= 0 || shards <= 0 || examples <= 0 {
		return perTrainer
	}
	// Each factor is capped below 2^31, so their product fits 64 bits.
	window := uint64(min(innerSteps, math.MaxInt32)) * uint64(min(samplesPerStep, math.MaxInt32))
	hi, lo := bits.Mul64(window, uint64(shards))
	if hi >= uint64(examples) {
		return max(perTrainer, MaxLeaseMicroshards) // the quotient would not fit 64 bits
	}
	q, r := bits.Div64(hi, lo, uint64(examples))
	if r > 0 {
		q++
	}
	return max(perTrainer, int(min(q, MaxLeaseMicroshards)))
}

// Window is what one trainer did with one lease: the samples its contribution reports and
// the inner steps its lease asked for.
type Window struct {
	Samples uint64
	Steps   uint32
}

// StepSamples is the samples per inner step (the workload's batch size) that a round's
// windows show: the median over windows of ceil(samples / steps), ignoring windows with no
// steps; 0 when there is none. The median, not the largest, so that a minority of
// trainers overstating their samples cannot inflate every lease; rounding up, so that a
// window whose last batch is partial still reads as its batch size. With an even count
// the lower middle value is taken (an integer, and the smaller lease).
func StepSamples(ws []Window) int {
	var per []uint64
	for _, w := range ws {
		if w.Steps == 0 {
			continue
		}
		q := w.Samples / uint64(w.Steps)
		if w.Samples%uint64(w.Steps) > 0 {
			q++
		}
		per = append(per, q)
	}
	if len(per) == 0 {
		return 0
	}
	slices.Sort(per)
	m := per[(len(per)-1)/2]
	return int(min(m, math.MaxInt32))
}
