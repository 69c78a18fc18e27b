//go:build attack

package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/adversary"
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
