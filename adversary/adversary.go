// Package adversary owns the ways a trainer built for attack tests misbehaves on purpose:
// the modes `p2pnode run --poison MODE` takes in a binary built with `-tags attack`, and
// the transforms behind them, pure functions on a pseudo-gradient or on the contribution
// announcing it. Only test builds use it: node wires it in files built with the attack tag
// (node/attack.go), and the default p2pnode binary has neither the flag nor the hooks.
package adversary

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/merge"
)

// Mode is one way an attacking trainer misbehaves.
type Mode string

// The modes. The first four corrupt the pseudo-gradient before it is encoded (CorruptDelta);
// the last two send an honest update but lie in its announcement (Rewrite).
const (
	NaN     Mode = "nan"     // NaN in the update
	Scale   Mode = "scale"   // the update × 1000
	Flip    Mode = "flip"    // the update with its sign flipped
	Noise   Mode = "noise"   // Gaussian noise with the update's norm instead of the update
	Replay  Mode = "replay"  // last round's update again, under this round's lease
	NoLease Mode = "nolease" // an honest update announced under a lease nobody granted
)

// Modes lists the modes.
var Modes = []Mode{NaN, Scale, Flip, Noise, Replay, NoLease}

// Parse returns the mode named s.
func Parse(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown attack mode %q (want one of %v)", s, Modes)
}

// CorruptsDelta says whether the mode corrupts the pseudo-gradient (CorruptDelta) rather
// than the announcement (Rewrite).
func (m Mode) CorruptsDelta() bool {
	switch m {
	case NaN, Scale, Flip, Noise:
		return true
	}
	return false
}

// CorruptDelta returns how mode corrupts a pseudo-gradient in place, nil for the modes that
// act on the announcement instead. seed seeds Noise: give each attacker its own, or
// colluding copies send the same vector and agree with each other.
func (m Mode) CorruptDelta(seed uint64) func(delta []float32) {
	switch m {
	case NaN:
		return func(d []float32) {
			for i := range d {
				if i%7 == 0 {
					d[i] = float32(math.NaN())
				}
			}
		}
	case Scale:
		return func(d []float32) {
			for i := range d {
				d[i] *= 1000
			}
		}
	case Flip:
		return func(d []float32) {
			for i := range d {
				d[i] = -d[i]
			}
		}
	case Noise:
		rng := rand.New(rand.NewPCG(seed, 99))
		return func(d []float32) {
			norm := merge.Norm(d, 1)
			var sum float64
			for i := range d {
				d[i] = float32(rng.NormFloat64())
				sum += float64(d[i]) * float64(d[i])
			}
			scale := float32(norm / math.Sqrt(max(sum, 1e-30)))
			for i := range d {
				d[i] *= scale
			}
		}
	}
	return nil
}

// Rewrite changes c, the announcement of an update trained on base, the way mode lies
// about it. It reports false when the attacker has nothing to send this round (Replay on a
// base that merged nothing).
func (m Mode) Rewrite(c *gossip.Contribution, base *chain.Head) bool {
	switch m {
	case Replay:
		// Announce an update that was already merged (the base head's first) as this round's.
		if len(base.Contributions) == 0 {
			return false
		}
		c.Delta = base.Contributions[0].Artifact
	case NoLease:
		c.Lease = cids.Record([]byte(fmt.Sprintf("no such lease %d", c.Round))).Bytes()
	}
	return true
}
