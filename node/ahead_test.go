package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/pyruntime"
)

// A trainer that joins when its epoch has nothing left to lease is leased microshards of
// the next epoch at once, instead of waiting for the epoch to end: with
// protocol.overlap: eager and an epoch of 8 microshards, round 1's two trainers lease 4 and
// reserve the other 4, so round 2 has nothing for a third trainer that joined during
// round 1. It is leased 2 microshards of epoch 1 and merged in round 2, which ends epoch 0
// and starts epoch 1 with them consumed; every microshard is merged once in its epoch (the
// audit of requireOneChain), and the validators agree on every head.
func TestMocknetLateTrainerLeasedFromTheNextEpoch(t *testing.T) {
	const rounds = 3
	c := newCluster(t, 2, 3, rounds, 8)
	for _, n := range c.nodes {
		n.cfg.Protocol.Overlap = config.OverlapEager
		n.cfg.Lease.MicroshardsPerTrainer = 2
		n.cfg.Lease.MinGroup = 2
		require.NoError(t, n.cfg.Validate())
	}
	late := c.nodes[4]
	// Round 1's windows end only once both validators have heard the late trainer, so that
	// it is live when round 2 is leased, however slow its start.
	heard := func() bool {
		for _, v := range c.nodes[:2] {
			seen := false
			for _, p := range v.n.Status().Peers {
				seen = seen || (p.Peer == late.host.ID().String() && !p.LastSeen.IsZero())
			}
			if !seen {
				return false
			}
		}
		return true
	}
	for _, n := range c.nodes[2:4] {
		n.rt.Hook = func(pyruntime.TrainJob) error {
			for end := time.Now().Add(time.Minute); !heard() && time.Now().Before(end); {
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}
	}
	for _, n := range c.nodes[:4] {
		c.start(n)
	}
	// Once round 1 is leased (to the two trainers: 4 leased, 4 reserved), the third starts.
	require.Eventually(t, func() bool {
		for _, v := range c.nodes[:2] {
			if vs := v.n.Status().Validator; vs != nil && vs.Round == 1 && len(vs.Leased) == 2 {
				return true
			}
		}
		return false
	}, time.Minute, 2*time.Millisecond, "round 1 was never leased to the two trainers")
	c.start(late)
	c.waitAnnounced(c.nodes)
	c.waitDone(2 * time.Minute)
	heads := c.requireOneChain(c.nodes, rounds)

	require.Len(t, heads[1].Contributions, 2, "round 1 was leased before the third trainer came")
	require.Equal(t, uint64(0), heads[1].Ledger.Epoch)
	var lateOf []uint64
	for _, h := range heads[1:] {
		for _, ct := range h.Contributions {
			if ct.Peer == late.host.ID().String() {
				lateOf = append(lateOf, h.Round)
				require.Equal(t, h.Round == 2, ct.Ahead, "round %d: only round 2's lease is of the next epoch", h.Round)
			} else {
				require.False(t, ct.Ahead, "round %d: %s had microshards of its epoch", h.Round, ct.Peer)
			}
		}
	}
	require.Contains(t, lateOf, uint64(2), "the late trainer is merged in its first round")
	require.Equal(t, uint64(1), heads[2].Ledger.Epoch, "round 2 ended epoch 0")
	require.Nil(t, heads[2].Ledger.Ahead, "and epoch 1 started with what was consumed of it ahead")
	require.Equal(t, 2, 8-len(lease.Available(heads[2].Ledger)), "2 of epoch 1's microshards were consumed in round 2")
}
