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

// The modes. NaN, Scale, Flip, Noise and the Subtle ones corrupt the pseudo-gradient before
// it is encoded (CorruptDelta); Replay and NoLease send an honest update but lie in its
// announcement (Rewrite).
const (
	NaN     Mode = "nan"     // NaN in the update
	Scale   Mode = "scale"   // the update × 1000
	Flip    Mode = "flip"    // the update with its sign flipped
	Noise   Mode = "noise"   // Gaussian noise with the update's norm instead of the update
	Replay  Mode = "replay"  // last round's update again, under this round's lease
	NoLease Mode = "nolease" // an honest update announced under a lease nobody granted

	// Collude: every colluder sends one direction, drawn from a seed they share, each
	// scaled to its own honest update's norm: they agree with each other, and their norms
	// are honest.
	Collude Mode = "collude"
	// ALIE, "a little is enough": the honest update shifted z standard deviations of the
	// honest spread (per coordinate, against the sign of the honest mean), as estimated
	// from the attacker's own honest updates so far: within the spread that median and
	// trimmed-mean rules keep.
	ALIE Mode = "alie"
	// Drift: the honest update plus a small constant bias every round (DriftBias of the
	// first honest update's norm, along a direction drawn from the shared seed).
	Drift Mode = "drift"
)

// Modes lists the modes screening is meant to catch one by one (each attacker on its own).
var Modes = []Mode{NaN, Scale, Flip, Noise, Replay, NoLease}

// Subtle lists the modes built to pass screening: colluders that agree with each other,
// and shifts within the honest spread.
var Subtle = []Mode{Collude, ALIE, Drift}

// Attack strengths of the subtle modes.
const (
	ALIEZ     = 1.0 // standard deviations ALIE shifts each coordinate by
	DriftBias = 0.1 // Drift's bias, as a fraction of the first honest update's norm
)

// Parse returns the mode named s.
func Parse(s string) (Mode, error) {
	for _, m := range All() {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown attack mode %q (want one of %v)", s, All())
}

// All lists every mode: Modes, then Subtle.
func All() []Mode { return append(append([]Mode(nil), Modes...), Subtle...) }

// CorruptsDelta says whether the mode corrupts the pseudo-gradient (CorruptDelta) rather
// than the announcement (Rewrite).
func (m Mode) CorruptsDelta() bool {
	switch m {
	case NaN, Scale, Flip, Noise, Collude, ALIE, Drift:
		return true
	}
	return false
}

// CorruptDelta returns how mode corrupts a pseudo-gradient in place, nil for the modes that
// act on the announcement instead. own seeds Noise: give each attacker its own, or noisy
// attackers send the same vector and agree with each other. shared seeds the direction of
// Collude and Drift: the same for every attacker that colludes. The function keeps state
// across calls (ALIE's estimate of the spread, Drift's bias): one per attacker.
func (m Mode) CorruptDelta(own, shared uint64) func(delta []float32) {
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
		rng := rand.New(rand.NewPCG(own, 99))
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
	case Collude:
		return func(d []float32) {
			norm := merge.Norm(d, 1)
			for i, u := range Direction(shared, len(d)) {
				d[i] = float32(norm) * u
			}
		}
	case ALIE:
		var s spread
		return func(d []float32) { s.shift(d, ALIEZ) }
	case Drift:
		var bias []float32
		return func(d []float32) {
			if len(bias) != len(d) {
				norm := merge.Norm(d, 1)
				bias = Direction(shared, len(d))
				for i := range bias {
					bias[i] *= float32(DriftBias * norm)
				}
			}
			for i := range d {
				d[i] += bias[i]
			}
		}
	}
	return nil
}

// Direction is a unit vector of n elements drawn from seed: every attacker with the same
// seed draws the same one.
func Direction(seed uint64, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, 0xc011))
	u := make([]float32, n)
	var sum float64
	for i := range u {
		u[i] = float32(rng.NormFloat64())
		sum += float64(u[i]) * float64(u[i])
	}
	inv := float32(1 / math.Sqrt(max(sum, 1e-30)))
	for i := range u {
		u[i] *= inv
	}
	return u
}

// spread is a running per-coordinate mean and variance (Welford) of the honest updates an
// ALIE attacker has trained.
type spread struct {
	n        int
	mean, m2 []float64
}

// shift adds the honest update d to the estimate, then moves each coordinate of d by z
// standard deviations against the sign of the mean. With fewer than two updates seen there
// is no spread, and d is sent as it is.
func (s *spread) shift(d []float32, z float64) {
	if len(s.mean) != len(d) {
		*s = spread{mean: make([]float64, len(d)), m2: make([]float64, len(d))}
	}
	s.n++
	for i, v := range d {
		x := float64(v)
		delta := x - s.mean[i]
		s.mean[i] += delta / float64(s.n)
		s.m2[i] += delta * (x - s.mean[i])
	}
	if s.n < 2 {
		return
	}
	for i := range d {
		sd := math.Sqrt(s.m2[i] / float64(s.n-1))
		if s.mean[i] > 0 {
			sd = -sd
		} else if s.mean[i] == 0 {
			sd = 0
		}
		d[i] += float32(z * sd)
	}
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
