//go:build attack

package node

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/adversary"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/synth"
)

// Issue 42 item 2: sign-flipping attackers that start before the honest trainers, so
// that a young chain is theirs alone for its first rounds, never hold it. Each run is
// compared with a clean run of the honest trainers alone on the same peer ids.
//
//	go test -race -tags attack -count=1 -run 'TestYoungChain' -v ./node/
//
// P2PNODE_YOUNG_ROUNDS (default 12) sets the rounds, P2PNODE_YOUNG_SEED (default 0) other
// peer ids, and so other trainer seeds; with 24 rounds or more the final held-out loss is
// also held to within 2 % of the clean run's (the goal: by then the data merged
// in the two runs no longer sets the loss).
func TestYoungChainOneAttackerFirst(t *testing.T) {
	youngChain(t, 5, 1)
}

func TestYoungChainHalfAttackersFirst(t *testing.T) {
	youngChain(t, 4, 4)
}

func youngChain(t *testing.T, honest, attackers int) {
	ref := config.ReferenceAuto
	if s := envStr("P2PNODE_YOUNG_REFERENCE"); s != "" {
		ref = s // "off" reproduces the capture
	}
	youngRounds := envInt(t, "P2PNODE_YOUNG_ROUNDS", 12)
	salt := byte(envInt(t, "P2PNODE_YOUNG_SEED", 0))
	clean, cleanHalf, _ := runYoungChain(t, honest, 0, ref, youngRounds, salt)
	attacked, _, c := runYoungChain(t, honest, attackers, ref, youngRounds, salt)
	heads := c.requireOneChain(c.nodes, youngRounds)
	bad := map[string]string{}
	for _, n := range c.nodes[1+honest:] {
		bad[n.host.ID().String()] = n.name
	}
	merged, honestMerged := 0, 0
	var at []string // the rounds an attacker update was merged in, with what screening saw
	for _, h := range heads {
		for _, ct := range h.Contributions {
			if _, ok := bad[ct.Peer]; ok {
				merged++
				at = append(at, proposedLine(c.nodes[0].logs.String(), h.Round))
			} else {
				honestMerged++
			}
		}
	}
	st := c.nodes[0].n.Status().Validator
	t.Logf("%d honest + %d attackers first (reference %s): %d attacker and %d honest updates merged; rejections %v; final held-out mse %.6g, clean run %.6g (%+.1f%%; %.6g at round %d)",
		honest, attackers, ref, merged, honestMerged, st.Rejections, attacked, clean, 100*(attacked-clean)/clean, cleanHalf, youngRounds*3/4)
	require.Zero(t, merged, "attacker updates merged, in: %s", strings.Join(at, "\n"))
	for _, n := range c.nodes[1 : 1+honest] {
		require.NotContains(t, st.Quarantined, n.host.ID().String(), "honest %s was quarantined", n.name)
	}
	// Which honest microshards were merged differs from the clean run (the rounds the
	// attackers held up are trained later, and under load trainers miss leases), and the
	// synthetic workload's loss after 12 rounds depends on the data merged: clean runs of
	// this test alone ended between 0.0056 and 0.0127 on the shared machine, so the final
	// losses of two runs are no yardstick. A captured chain ends orders of magnitude worse
	// (reference off: 0.705 and 7·10⁴). The check: the attackers cost the honest swarm at
	// most a quarter of the run — it ends at least where the clean run was at round 9 (at
	// round 6 the clean run was still at 0.715).
	require.LessOrEqual(t, attacked, cleanHalf, "the attacked run must end where the clean run was by round %d", youngRounds*3/4)
	if youngRounds >= 24 {
		require.LessOrEqual(t, attacked, 1.02*clean, "final held-out loss more than 2 %% worse than the clean run's")
	}
}

// proposedLine is the validator's "proposed head" log line of round r (its screening
// summary), or what says it has none.
func proposedLine(logs string, r uint64) string {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "proposed head") && strings.Contains(l, fmt.Sprintf(" round=%d ", r)) {
			return l
		}
	}
	return fmt.Sprintf("round %d (no proposed head line)", r)
}

func envStr(name string) string {
	v, _ := os.LookupEnv(name)
	return strings.TrimSpace(v)
}

// runYoungChain runs a validator, the attackers (sign flips) and then, 3 s later, the
// honest trainers, and returns the held-out mse of the last head and of the head three
// quarters of the way.
func runYoungChain(t *testing.T, honest, attackers int, ref string, youngRounds int, salt byte) (final, half float64, c *cluster) {
	c = newClusterSalted(t, salt, 1, honest+attackers, youngRounds, 64, 1+honest+attackers)
	c.nodes[0].logs = &syncBuffer{}
	for i, n := range c.nodes {
		n.cfg.Merge.Screen.Reference = ref
		n.cfg.Node.KeepHeads = youngRounds + 1 // the halfway head's parameters are evaluated
		n.cfg.Lease.RoundTimeout = 10 * time.Second
		n.cfg.Lease.MicroshardsPerTrainer = 1
		n.rt.LR = 0.01
		n.rt.Delay = 50 * time.Millisecond
		if i > honest {
			n.extra = append(n.extra, attackOption(adversary.Flip))
			n.name = fmt.Sprintf("attacker-%d", i-honest)
		}
	}
	c.start(c.nodes[0])
	for _, n := range c.nodes[1+honest:] {
		c.start(n)
	}
	time.Sleep(3 * time.Second)
	for _, n := range c.nodes[1 : 1+honest] {
		c.start(n)
	}
	c.waitDone(4 * time.Minute)
	_, heads := c.chainOf(c.nodes[0])
	require.Len(t, heads, youngRounds+1)
	stores, err := OpenStores(c.nodes[0].cfg)
	require.NoError(t, err)
	mse := func(round int) float64 {
		require.Equal(t, uint64(round), heads[round].Round)
		id, err := heads[round].ParamsID()
		require.NoError(t, err)
		m, err := synth.New(t.TempDir()).Evaluate(context.Background(), stores.Artifacts.BlobPath(id))
		require.NoError(t, err)
		return m["mse"]
	}
	return mse(youngRounds), mse(youngRounds * 3 / 4), c
}
