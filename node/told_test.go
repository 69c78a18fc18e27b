//go:build attack

package node

import (
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/adversary"
)

// TestTrainerIsToldOfRejectionAndQuarantine: a trainer whose contributions are rejected
// (it announces them under leases nobody granted) reads it in its own log, from the round
// notes every node follows: one WARN line per rejected round with the reason and what it
// means, one when it is quarantined and one when the quarantine is over. The validator's
// chain gives every peer's account: the honest ones merged every round, the attacker
// rejected for no_lease and quarantined.
func TestTrainerIsToldOfRejectionAndQuarantine(t *testing.T) {
	const rounds = 7
	c := newClusterSorted(t, 1, 3, rounds, 40, 3)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 2
		n.cfg.Lease.RoundTimeout = 5 * time.Second
		n.cfg.Lease.QuarantineRounds = 2
	}
	attacker := c.nodes[3]
	attacker.extra, attacker.name = append(attacker.extra, attackOption(adversary.NoLease)), "attacker-nolease"
	attacker.logs = &syncBuffer{}
	honest := c.nodes[1]
	honest.logs = &syncBuffer{}
	c.startAll()
	c.waitDone(3 * time.Minute)
	c.requireOneChain(c.nodes, rounds)

	logs := attacker.logs.String()
	rejected := regexp.MustCompile(`level=WARN msg="contribution to round (\d+) rejected: no_lease \(no validator had leased that work to this node\)"`).FindAllStringSubmatch(logs, -1)
	require.GreaterOrEqual(t, len(rejected), 2, "the attacker is told of each rejection:\n%s", logs)
	seen := map[string]bool{}
	for _, m := range rejected {
		require.False(t, seen[m[1]], "round %s told twice", m[1])
		seen[m[1]] = true
	}
	require.Regexp(t, `level=WARN msg="quarantined through round \d+: no leases until then`, logs)
	require.Regexp(t, `level=WARN msg="quarantine over \(it ended with round \d+\): leases again"`, logs)
	require.NotContains(t, honest.logs.String(), "msg=\"quarantined through", "the honest trainer is not told of another's quarantine")

	st, err := OpenStores(c.nodes[0].cfg)
	require.NoError(t, err)
	tip, err := st.ResolveHead("latest")
	require.NoError(t, err)
	l, err := st.Credits(tip, c.nodes[0].cfg.Experiment.Validators)
	require.NoError(t, err)
	bad := l.Account(attacker.host.ID().String())
	require.Zero(t, bad.Merged)
	require.GreaterOrEqual(t, bad.Rejected["no_lease"], len(rejected), "every rejection it was told of is on the chain")
	require.GreaterOrEqual(t, bad.Quarantines, 1)
	merged := 0
	for _, n := range c.nodes[1:3] {
		merged += l.Account(n.host.ID().String()).Merged
	}
	require.Equal(t, 2*rounds, merged, "the honest trainers were merged every round")
	// The status pages say it too: the attacker's own account, and every contributor on
	// the validator's.
	as := attacker.n.Status()
	require.NotNil(t, as.Credit)
	require.Equal(t, attacker.host.ID().String(), as.Credit.Peer)
	require.GreaterOrEqual(t, as.Credit.Rejected["no_lease"], len(rejected))
	require.Regexp(t, `^merged 0 \(0 samples\), rejected \d+ \(no_lease( ×\d+)?\)`, as.CreditSummary)
	hs := honest.n.Status()
	require.Regexp(t, `^merged \d+ \(\d+ samples\), rejected 0$`, hs.CreditSummary)
	vs := c.nodes[0].n.Status()
	require.Nil(t, vs.Credit, "a validator that does not train has no account of its own")
	require.Len(t, vs.Contributors, 3)
	t.Logf("attacker: %s; its status page: %s", bad.Summary(l.Round), as.CreditSummary)
}
