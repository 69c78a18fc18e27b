package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
)

// TestLateVolunteerBesideATrainingOwner: an owner that validates and trains (its reference
// window and its own window share one worker) and a volunteer that joins once the chain is
// a few rounds old, the demo's screening defaults. Issue 42 item 4: with two updates a
// round, the pair was its own yardstick and an honest volunteer was rejected norm_outlier
// and quarantined. Against the owner's reference window neither is judged by the other:
// the volunteer is merged and never rejected.
func TestLateVolunteerBesideATrainingOwner(t *testing.T) {
	const rounds, joinAt = 20, 5
	c := newCluster(t, 1, 1, rounds, 48)
	owner, volunteer := c.nodes[0], c.nodes[1]
	owner.name, volunteer.name = "owner", "volunteer"
	owner.cfg.Experiment.Roles = []string{config.RoleValidator, config.RoleTrainer}
	for _, n := range c.nodes {
		n.cfg.Lease.RoundTimeout = 10 * time.Second
		// Rounds of half a second at least, so that the volunteer, heard a few seconds
		// after it starts, joins well before the run ends.
		n.rt.Delay = 500 * time.Millisecond
		require.NoError(t, n.cfg.Validate())
	}
	c.start(owner)
	require.Eventually(t, func() bool { return owner.n.Status().Round >= joinAt }, 2*time.Minute, 100*time.Millisecond)
	c.start(volunteer)
	c.waitDone(3 * time.Minute)

	heads := c.requireOneChain(c.nodes, rounds)
	vid := volunteer.host.ID().String()
	merged := 0
	for _, h := range heads {
		for _, ct := range h.Contributions {
			if ct.Peer == vid {
				merged++
			}
		}
	}
	st := owner.n.Status().Validator
	require.NotNil(t, st)
	t.Logf("volunteer merged in %d of the %d rounds after it joined at round %d; rejections %v", merged, rounds-joinAt, joinAt, st.Rejections)
	require.Positive(t, merged, "the volunteer's updates are merged")
	require.Empty(t, st.Rejections, "no honest update is rejected")
	require.NotContains(t, st.Quarantined, vid, "the volunteer is not quarantined")
}
