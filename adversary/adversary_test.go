package adversary

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/merge"
)

func TestParse(t *testing.T) {
	for _, m := range Modes {
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
			tt.mode.CorruptDelta(1)(d)
			tt.check(t, d)
		})
	}
	for _, m := range []Mode{Replay, NoLease} {
		require.False(t, m.CorruptsDelta(), m)
		require.Nil(t, m.CorruptDelta(1), m)
	}
}

// Two noisy attackers with different seeds send different vectors: with one seed they
// agreed with each other and passed the cosine check together.
func TestNoiseDiffersBySeed(t *testing.T) {
	a, b := make([]float32, 64), make([]float32, 64)
	for i := range a {
		a[i], b[i] = 1, 1
	}
	Noise.CorruptDelta(1)(a)
	Noise.CorruptDelta(2)(b)
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
