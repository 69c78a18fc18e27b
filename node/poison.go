package node

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/p2pnode/p2pnode/merge"
)

// Poison modes for `p2pnode run --poison MODE`: a trainer that misbehaves on purpose, for
// end-to-end tests of screening and quarantine. Never used by an honest node.
const (
	PoisonNaN     = "nan"     // NaN in the update
	PoisonScale   = "scale"   // the update × 1000
	PoisonFlip    = "flip"    // the update with its sign flipped
	PoisonNoise   = "noise"   // Gaussian noise with the update's norm instead of the update
	PoisonReplay  = "replay"  // last round's update again, under this round's lease
	PoisonNoLease = "nolease" // an honest update announced under a lease nobody granted
)

// PoisonModes lists the modes.
var PoisonModes = []string{PoisonNaN, PoisonScale, PoisonFlip, PoisonNoise, PoisonReplay, PoisonNoLease}

// poisonDelta returns the delta corruption of a mode (nil for modes that act elsewhere).
func poisonDelta(mode string, seed uint64) (func([]float32), error) {
	switch mode {
	case "", PoisonReplay, PoisonNoLease:
		return nil, nil
	case PoisonNaN:
		return func(d []float32) {
			for i := range d {
				if i%7 == 0 {
					d[i] = float32(math.NaN())
				}
			}
		}, nil
	case PoisonScale:
		return func(d []float32) {
			for i := range d {
				d[i] *= 1000
			}
		}, nil
	case PoisonFlip:
		return func(d []float32) {
			for i := range d {
				d[i] = -d[i]
			}
		}, nil
	case PoisonNoise:
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
		}, nil
	}
	return nil, fmt.Errorf("--poison: unknown mode %q (want one of %v)", mode, PoisonModes)
}
