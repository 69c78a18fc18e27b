package adversary

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/merge"
)

func TestParse(t *testing.T) {
	for _, m := range All() {
		got, err := Parse(string(m))
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	for _, s := range []string{"", "NaN", "x1000"} {
		_, err := Parse(s)
		require.ErrorContains(t, err, "unknown attack mode", s)
	}
}

func TestCorruptDelta(t *testing.T) {
	honest := []float32{0.5, -1, 2, 0.25, -0.75, 1.5, -2, 3}
	norm := merge.Norm(honest, 1)
	tests := []struct {
		mode  Mode
		check func(t *testing.T, d []float32)
	}{
		{NaN, func(t *testing.T, d []float32) {
			for i, v := range d {
				require.Equal(t, i%7 == 0, math.IsNaN(float64(v)), "element %d", i)
			}
		}},
		{Scale, func(t *testing.T, d []float32) {
			for i, v := range d {
				require.Equal(t, honest[i]*1000, v)
			}
		}},
		{Flip, func(t *testing.T, d []float32) {
			for i, v := range d {
				require.Equal(t, -honest[i], v)
			}
		}},
		{Noise, func(t *testing.T, d []float32) {
			require.InDelta(t, norm, merge.Norm(d, 1), 1e-4*norm, "noise keeps the update's norm")
			require.NotEqual(t, honest, d)
		}},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			require.True(t, tt.mode.CorruptsDelta())
			d := append([]float32(nil), honest...)
			tt.mode.CorruptDelta(1, 9)(d)
			tt.check(t, d)
		})
	}
	for _, m := range []Mode{Replay, NoLease} {
		require.False(t, m.CorruptsDelta(), m)
		require.Nil(t, m.CorruptDelta(1, 9), m)
	}
}

// Two noisy attackers with different seeds send different vectors: with one seed they
// agreed with each other and passed the cosine check together.
func TestNoiseDiffersBySeed(t *testing.T) {
	a, b := make([]float32, 64), make([]float32, 64)
	for i := range a {
		a[i], b[i] = 1, 1
	}
	Noise.CorruptDelta(1, 9)(a)
	Noise.CorruptDelta(2, 9)(b)
	require.NotEqual(t, a, b)
}

func TestRewrite(t *testing.T) {
	merged := []byte("merged delta")
	base := &chain.Head{Contributions: []chain.Contribution{{Artifact: merged}}}
	honest := gossip.Contribution{Round: 3, Lease: []byte("lease"), Delta: []byte("delta")}
	tests := []struct {
		mode  Mode
		base  *chain.Head
		send  bool
		lease bool // the lease is kept
		delta []byte
	}{
		{Flip, base, true, true, honest.Delta},
		{Replay, base, true, true, merged},
		{Replay, &chain.Head{}, false, true, honest.Delta},
		{NoLease, base, true, false, honest.Delta},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			c := honest
			require.Equal(t, tt.send, tt.mode.Rewrite(&c, tt.base))
			require.Equal(t, tt.delta, c.Delta)
			require.Equal(t, tt.lease, string(c.Lease) == "lease")
		})
	}
}

func cosine(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

// honestUpdates are n updates of dim coordinates around a common direction (signal) with
// noise of the given size per coordinate: what a round's honest trainers send.
func honestUpdates(n, dim int, noise float64, seed uint64) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([][]float32, n)
	for k := range out {
		out[k] = make([]float32, dim)
		for i := range out[k] {
			signal := 1.0
			if i%2 == 1 {
				signal = -0.5
			}
			out[k][i] = float32(signal + noise*rng.NormFloat64())
		}
	}
	return out
}

func clone(d []float32) []float32 { return append([]float32(nil), d...) }

// Colluders with a shared seed send one direction, each at its own honest norm, whatever
// their honest updates were; another shared seed is another direction.
func TestCollude(t *testing.T) {
	honest := honestUpdates(3, 256, 0.3, 1)
	var sent [][]float32
	for k, h := range honest {
		d := clone(h)
		Collude.CorruptDelta(uint64(100+k), 7)(d)
		require.InDelta(t, merge.Norm(h, 1), merge.Norm(d, 1), 1e-4*merge.Norm(h, 1), "colluder %d keeps its honest norm", k)
		sent = append(sent, d)
	}
	for k := 1; k < len(sent); k++ {
		require.InDelta(t, 1, cosine(sent[0], sent[k]), 1e-6, "colluders 0 and %d agree", k)
	}
	require.Less(t, math.Abs(cosine(sent[0], honest[0])), 0.3, "the shared direction is not the honest one")
	other := clone(honest[0])
	Collude.CorruptDelta(100, 8)(other)
	require.Less(t, math.Abs(cosine(sent[0], other)), 0.3)
}

// ALIE sends its honest update in the first round, then shifts every coordinate by z
// standard deviations of the honest updates it has seen, against the mean's sign: the
// shift is bounded by the spread, and a spread of 0 shifts nothing.
func TestALIE(t *testing.T) {
	for _, tc := range []struct {
		name  string
		noise float64
	}{{"spread", 0.3}, {"no spread", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			rounds := honestUpdates(6, 512, tc.noise, 2)
			attack := ALIE.CorruptDelta(1, 7)
			for r, h := range rounds {
				d := clone(h)
				attack(d)
				if r == 0 || tc.noise == 0 {
					require.Equal(t, h, d, "round %d: nothing to shift by", r)
					continue
				}
				var shiftSq float64
				for i := range d {
					s := float64(d[i] - h[i])
					shiftSq += s * s
					var mean float64 // of the honest updates the attacker has seen
					for _, seen := range rounds[:r+1] {
						mean += float64(seen[i])
					}
					require.Equal(t, -math.Copysign(1, mean), math.Copysign(1, s), "round %d coordinate %d shifted with the mean", r, i)
				}
				// Each coordinate moved about ALIEZ × the honest noise (0.3): well within
				// what a robust rule keeps, and far from a sign flip.
				rms := math.Sqrt(shiftSq / float64(len(d)))
				require.InDelta(t, ALIEZ*tc.noise, rms, 0.5*ALIEZ*tc.noise, "round %d", r)
				require.Greater(t, cosine(d, h), 0.5, "round %d: still near the honest update", r)
			}
		})
	}
}

// Drift adds the same small bias every round: DriftBias of the first honest update's norm,
// along the shared seed's direction.
func TestDrift(t *testing.T) {
	rounds := honestUpdates(4, 256, 0.3, 3)
	attack := Drift.CorruptDelta(1, 7)
	var bias []float32
	for r, h := range rounds {
		d := clone(h)
		attack(d)
		b := make([]float32, len(d))
		for i := range d {
			b[i] = d[i] - h[i]
		}
		if r == 0 {
			bias = b
			require.InDelta(t, DriftBias*merge.Norm(h, 1), merge.Norm(b, 1), 1e-3*merge.Norm(h, 1))
			require.InDelta(t, 1, cosine(b, Direction(7, len(d))), 1e-5)
			continue
		}
		require.InDeltaSlice(t, bias, b, 1e-5, "round %d: the same bias", r)
		require.Greater(t, cosine(d, h), 0.99, "round %d: a small bias", r)
	}
}

func TestDirectionIsUnitAndSeeded(t *testing.T) {
	a, b, c := Direction(7, 1000), Direction(7, 1000), Direction(8, 1000)
	require.Equal(t, a, b)
	require.NotEqual(t, a, c)
	require.InDelta(t, 1, merge.Norm(a, 1), 1e-5)
}
