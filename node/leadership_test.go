package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLeaderWaitingForMinGroupKeepsItsRound: the round's leader waits for a minimum group
// of trainers that is not up yet. While it waits it grants nothing, but its heartbeats say
// it is alive, so the other validators do not take the round over (they would only wait
// for the same trainers, and two leaders of one round lease every trainer twice). Before
// the fix the leader was silent until its first grant, and both followers took round 1
// over within 4 s.
func TestLeaderWaitingForMinGroupKeepsItsRound(t *testing.T) {
	const rounds = 2
	c := newCluster(t, 3, 4, rounds, 40)
	for _, n := range c.nodes {
		n.cfg.Experiment.Quorum = 2
		n.cfg.Lease.MinGroup = 4
		require.NoError(t, n.cfg.Validate())
		n.logs = &syncBuffer{}
	}
	// A failure in CI must be diagnosable from its output: every node's own log lines.
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.nodes {
				t.Logf("%s:\n%s", n.name, nodeLines(n.logs.String()))
			}
		}
	})
	late := c.nodes[len(c.nodes)-1]
	for _, n := range c.nodes[:len(c.nodes)-1] {
		c.start(n)
	}
	// Three of four trainers announce; the followers hear them too, so they cannot tell
	// the leader's wait from its silence by the fleet alone.
	time.Sleep(3*leaseWait + 2*takeoverStep)
	c.start(late)
	c.waitDone(2 * time.Minute)
	c.requireOneChain(c.nodes, rounds)
	for _, v := range c.nodes[:3] {
		for _, e := range v.n.Status().Events {
			require.NotEqual(t, "takeover", e.Kind, "%s: %s", v.name, e.Text)
		}
	}
}
