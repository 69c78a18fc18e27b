//go:build attack

package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/adversary"
	"github.com/p2pnode/p2pnode/synth"
)

// TestAttackersAreScreenedOut: six trainers, one per adversary mode, beside four honest
// ones (the attack tag builds the attackers: attack.go).
func TestAttackersAreScreenedOut(t *testing.T) {
	clean, cc := runAttackCluster(t, false)
	attacked, c := runAttackCluster(t, true)
	t.Logf("merged work: clean run %s; attacked run %s", mergedWork(cc), mergedWork(c))
	checkAttack(t, c, clean, attacked)
}

// mergedWork summarises what a run merged: contributions and samples over all rounds, and
// the microshards trained per round.
func mergedWork(c *cluster) string {
	_, heads := c.chainOf(c.nodes[0])
	var contribs, samples, shards uint64
	for _, h := range heads {
		for _, ct := range h.Contributions {
			contribs++
			samples += ct.Samples
			shards += uint64(len(ct.Microshards))
		}
	}
	var per []string
	for _, h := range heads {
		var r []string
		for _, ct := range h.Contributions {
			r = append(r, fmt.Sprintf("%s:%v", ct.Peer[len(ct.Peer)-4:], ct.Microshards))
		}
		per = append(per, fmt.Sprint(r))
	}
	return fmt.Sprintf("%d contributions, %d samples, %d microshards over %d rounds %v", contribs, samples, shards, len(heads)-1, per)
}

func runAttackCluster(t *testing.T, attack bool) (float64, *cluster) {
	const rounds = 16
	{
		var modes []adversary.Mode
		if attack {
			modes = adversary.Modes
		}
		c := newClusterSorted(t, 1, 4+len(modes), rounds, 64, 5)
		for i, n := range c.nodes {
			n.cfg.Merge.Screen.MinCosine = new(0.2)
			n.cfg.Lease.QuarantineRounds = 100
			n.cfg.Lease.RoundTimeout = 10 * time.Second
			// Every attempt gets the whole 10 s: with the adaptive deadline (3 s floor) an
			// honest trainer slowed by -race on a loaded machine missed its lease now and
			// then, every later round got other microshards, and clean runs alone ended
			// 0.00065–0.00091 apart — the 2 % comparison measured the schedule, not the
			// attackers.
			n.cfg.Lease.MinDeadline = 10 * time.Second
			n.cfg.Lease.MicroshardsPerTrainer = 1
			n.cfg.Lease.MinGroup = 4
			// A slow learner keeps honest updates pointing the same way for the whole run, so
			// the cosine check can tell noise from signal.
			n.rt.LR = 0.01
			n.rt.Delay = 50 * time.Millisecond
			if i >= 5 {
				n.extra = append(n.extra, attackOption(modes[i-5]))
				n.name = "attacker-" + string(modes[i-5])
			}
		}
		// Everyone announces before the validator leases round 1, so the attackers are
		// offered leases from the start.
		for _, n := range c.nodes[1:] {
			c.start(n)
		}
		c.waitAnnounced(c.nodes[1:])
		c.start(c.nodes[0])
		c.waitDone(3 * time.Minute)
		_, heads := c.chainOf(c.nodes[0])
		last := heads[len(heads)-1]
		id, _ := last.ParamsID()
		stores, _ := OpenStores(c.nodes[0].cfg)
		m, err := synth.New(t.TempDir()).Evaluate(context.Background(), stores.Artifacts.BlobPath(id))
		require.NoError(t, err)
		return m["mse"], c
	}
}

func checkAttack(t *testing.T, c *cluster, clean, attacked float64) {
	const rounds = 16
	heads := c.requireOneChain(c.nodes, rounds)
	attackers := map[string]string{}
	for _, n := range c.nodes[5:] {
		attackers[n.host.ID().String()] = n.name
	}
	for _, h := range heads {
		for _, ct := range h.Contributions {
			require.NotContains(t, attackers, ct.Peer, "round %d merged %s", h.Round, attackers[ct.Peer])
		}
	}
	q := c.nodes[0].n.Status().Validator.Quarantined
	for p, name := range attackers {
		require.Contains(t, q, p, "%s is not quarantined", name)
	}
	for _, n := range c.nodes[1:5] {
		require.NotContains(t, q, n.host.ID().String(), "honest %s was quarantined", n.name)
	}
	t.Logf("final held-out mse: %.6g without attackers, %.6g with six (%+.2f%%)", clean, attacked, 100*(attacked-clean)/clean)
	// Issue 12 item 4: the honest held-out loss against a clean run, goal within 2 % — the
	// attackers must not make it worse. Ending better is no harm: once the attackers are
	// barred, their microshards go back to the pool and honest trainers train on them, so
	// the attacked run legitimately sees other data than the clean one.
	require.LessOrEqual(t, attacked, 1.02*clean, "the attacked run must end at most 2%% worse than the clean one")
}
