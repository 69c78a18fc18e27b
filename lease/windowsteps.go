package lease

import "math"

// WindowSteps scales each leased trainer's steps by the microshards it got against its
// share (perTrainer scaled by relative capacity, as Assign computes it), so that a window
// reads its data once whatever its size and, since merge weights are the samples trained,
// weighs what it read:
//
//   - at an epoch's tail, where fewer microshards are left than the shares ask for, a
//     trainer with one microshard of three runs a third of its steps (at least 1) instead
//     of looping over its data three times;
//   - in the round that takes the epoch's leftover with it (AbsorbTail), a trainer with
//     three microshards of two runs half as many steps again.
//
// steps is not changed.
func WindowSteps(steps map[string]int, plan map[string][]uint32, trainers []Trainer, perTrainer int) map[string]int {
	rel := Relative(trainers)
	out := make(map[string]int, len(steps))
	for p, s := range steps {
		out[p] = s
		got, ok := plan[p]
		if !ok || perTrainer <= 0 {
			continue
		}
		share := shareOf(perTrainer, rel[p])
		if len(got) != share {
			out[p] = max(1, int(math.Round(float64(s)*float64(len(got))/float64(share))))
		}
	}
	return out
}

// AbsorbTail is the share to lease n available microshards with. Where they are the epoch's
// last full round plus a leftover of at most half a round (the shares' total at perTrainer
// is below n, and n exceeds it by at most half), the share is raised so that this round
// leases them all — ceil(perTrainer × n / total) — and WindowSteps lengthens its windows to
// match, instead of a round of short windows after it. Otherwise it is perTrainer.
//
// A round of short windows was measured to set the model back on lm tiny (docs/diloco-cost.md,
// issue 44): its update holds fewer steps per window and half the microshards of a full
// round, and it moved the held-out loss up by 0.6 % on average where full rounds moved it
// down by 1.1 %. A leftover larger than half a round stays a round of its own: windows of
// more than one and a half times inner_steps would stretch that round's deadline and its
// trainers' memory of the base.
func AbsorbTail(n int, trainers []Trainer, perTrainer int) int {
	ts := byPeer(trainers)
	rel := Relative(ts)
	total := 0
	for _, t := range ts {
		total += wantOf(perTrainer, rel[t.Peer])
	}
	if total <= 0 || n <= total || 2*(n-total) > total {
		return perTrainer
	}
	return (perTrainer*n + total - 1) / total
}
