//go:build attack

package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/adversary"
	"github.com/p2pnode/p2pnode/config"
)

// TestRejectedPeerIsNotLeasedAgainInItsRound: two honest trainers and one that announces
// its updates under a lease nobody granted, with min_group 3. The old leader re-leased the
// rejected trainer (the only one that had not "reported") every deadline, forever: the
// round never closed. Now it is barred for the rest of the round, and the round closes
// with the two honest contributions once no other trainer is left to lease to.
func TestRejectedPeerIsNotLeasedAgainInItsRound(t *testing.T) {
	const rounds = 3
	c := newClusterSorted(t, 1, 3, rounds, 40, 3)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 3
		n.cfg.Lease.RoundTimeout = 5 * time.Second
	}
	attacker := c.nodes[3]
	attacker.extra, attacker.name = append(attacker.extra, attackOption(adversary.NoLease)), "attacker-nolease"
	c.startAll()
	c.waitDone(2 * time.Minute)
	heads := c.requireOneChain(c.nodes, rounds)
	for _, h := range heads[1:] {
		require.Len(t, h.Contributions, 2, "round %d merges the two honest trainers", h.Round)
		for _, ct := range h.Contributions {
			require.NotEqual(t, attacker.host.ID().String(), ct.Peer)
		}
	}
	// One lease a round at most: the attacker trains once per lease it gets.
	calls := attacker.rt.Status().Calls
	require.LessOrEqual(t, calls, int64(rounds), "the rejected trainer was leased %d times in %d rounds", calls, rounds)
	st := c.nodes[0].n.Status()
	require.NotNil(t, st.Validator)
	require.GreaterOrEqual(t, st.Validator.Rejections["no_lease"], uint64(1))
	t.Logf("attacker leased %d times in %d rounds; rejections %v", calls, rounds, st.Validator.Rejections)
}

// TestDisagreeingPairIsLeasedOneAtATime: two trainers whose updates point away from each
// other (one flips its sign) in a young chain, where a pair is held to each other and both
// are rejected. Every retry on the same base disagreed again, and the round never closed
// (an epoch's tail did the same to two honest trainers in e2e). Now the round's later
// attempts lease one trainer at a time: the honest trainer, first in peer order, is merged
// alone and every round closes.
func TestDisagreeingPairIsLeasedOneAtATime(t *testing.T) {
	const rounds = 3
	c := newClusterSorted(t, 1, 2, rounds, 40, 2)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 2
		n.cfg.Lease.RoundTimeout = 5 * time.Second
		// The fallback without a reference update: a pair is held to each other.
		n.cfg.Merge.Screen.Reference = config.ReferenceOff
	}
	flipper := c.nodes[2]
	flipper.extra, flipper.name = append(flipper.extra, attackOption(adversary.Flip)), "attacker-flip"
	for _, n := range c.nodes[1:] {
		c.start(n)
	}
	// Both trainers announce before round 1 is leased, so its first attempt is a pair.
	c.waitAnnounced(c.nodes[1:])
	c.start(c.nodes[0])
	c.waitDone(2 * time.Minute)
	heads := c.requireOneChain(c.nodes, rounds)
	honest := c.nodes[1].host.ID().String()
	for _, h := range heads[1:] {
		require.Len(t, h.Contributions, 1, "round %d merges one trainer", h.Round)
		require.Equal(t, honest, h.Contributions[0].Peer, "round %d merged the flipper", h.Round)
	}
	st := c.nodes[0].n.Status()
	require.NotNil(t, st.Validator)
	require.GreaterOrEqual(t, st.Validator.Rejections["low_cosine"], uint64(2), "round 1's pair was rejected")
	t.Logf("rejections %v", st.Validator.Rejections)
}
