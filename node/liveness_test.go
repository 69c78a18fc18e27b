package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/validator"
)

// Liveness: no trainer can hold a round hostage (issue 12). Each test here stalls or fails
// on the leader that re-leased a failed trainer attempt after attempt.

// TestFailingWorkerReleasesItsLease: a trainer whose workload always raises gives every
// lease back at once; the validator returns its microshards to the pool (exactly once per
// epoch still holds), never waits out a deadline for it, and quarantines it after
// repeated misses. The old trainer kept the failed lease, the old leader waited out the
// deadline, and misses never counted.
func TestFailingWorkerReleasesItsLease(t *testing.T) {
	const rounds = 8
	c := newCluster(t, 1, 3, rounds, 24)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 2
		n.cfg.Lease.RoundTimeout = 30 * time.Second
	}
	failing := c.nodes[3]
	failing.name = "trainer-failing"
	failing.rt.Hook = func(pyruntime.TrainJob) error { return errors.New("loss() raised: CUDA error: device-side assert") }
	c.startAll()
	c.waitDone(2 * time.Minute)
	heads := c.requireOneChain(c.nodes, rounds)
	id := failing.host.ID().String()
	for _, h := range heads {
		for _, ct := range h.Contributions {
			require.NotEqual(t, id, ct.Peer)
		}
	}
	st := c.nodes[0].n.Status()
	require.Contains(t, st.Validator.Quarantined, id, "repeated misses put the failing trainer in quarantine")
	// The status says where the validator's loop is: after the last round, the quorum on
	// its own proposal of it.
	require.NotNil(t, st.Validator.Phase)
	require.Equal(t, validator.Phase{Name: validator.PhaseAwaitingQuorum, Round: rounds, Since: st.Validator.Phase.Since}, *st.Validator.Phase)
	require.False(t, st.Validator.Phase.Since.IsZero())
	for _, e := range st.Events {
		require.NotEqual(t, "missing", e.Kind, "no lease waited out its deadline: %s", e.Text)
	}
	released := 0
	for _, e := range st.Events {
		if e.Kind == "release" && strings.Contains(e.Text, "gave its lease back") {
			released++
		}
	}
	require.Positive(t, released, "the failing trainer gave leases back")
	t.Logf("failing trainer trained %d times, released %d leases seen in events; quarantined through round %d",
		failing.rt.Status().Calls, released, st.Validator.Quarantined[id])
}

// TestNaNHeldOutMetricsDoNotStopTheChain: a validator whose evaluation returns NaN and
// +Inf (a model gone wrong) still proposes every head; the non-finite values are dropped,
// the finite ones kept. The old validator failed every round on encoding the NaN.
func TestNaNHeldOutMetricsDoNotStopTheChain(t *testing.T) {
	const rounds = 4
	c := newCluster(t, 1, 2, rounds, 20)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 2
		n.cfg.Experiment.EvalEvery = 1
	}
	c.nodes[0].rt.EvalHook = func(m map[string]float64) map[string]float64 {
		return map[string]float64{"mse": math.NaN(), "rmse": math.Inf(1), "accuracy": 0.5}
	}
	c.startAll()
	c.waitDone(2 * time.Minute)
	c.requireOneChain(c.nodes, rounds)
	for _, n := range c.nodes {
		st := n.n.Status()
		require.Equal(t, map[string]float64{"accuracy": 0.5}, st.HeadMetrics, "%s: the finite metric travels, NaN and Inf do not", n.name)
	}
	warned := 0
	for _, e := range c.nodes[0].n.Status().Events {
		if e.Kind == "evaluate" {
			warned++
		}
	}
	require.Equal(t, 2, warned, "one warning per non-finite metric, not one per round")
}

// TestFloodedValidatorDoesNotSpin: a peer floods the contributions and releases topics with
// messages for leases nobody granted. Every rejection is counted by reason, logged at most
// once per peer and round, and the leader neither re-leases in a spin nor stalls.
func TestFloodedValidatorDoesNotSpin(t *testing.T) {
	const rounds = 4
	c := newCluster(t, 1, 2, rounds, 20)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 2
	}
	v := c.nodes[0]
	v.logs = &syncBuffer{}
	// The flooder: a plain gossip node of the experiment.
	fh := c.addPeer(len(c.nodes), "")
	require.NoError(t, c.mn.LinkAll())
	var vids []peer.ID
	vids = append(vids, v.host.ID())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := gossip.New(ctx, gossip.Params{Host: fh, Network: v.cfg.Experiment.Network, Experiment: v.cfg.Experiment.ID, Validators: vids,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer g.Close()
	c.startAll()
	for _, n := range c.nodes {
		_, _ = c.mn.ConnectPeers(fh.ID(), n.host.ID())
	}
	sent := 0
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		for i := 0; ctx.Err() == nil; i++ {
			st := v.n.Status()
			if st.Head == "" || st.Round >= rounds {
				time.Sleep(20 * time.Millisecond)
				if st.Round >= rounds {
					return
				}
				continue
			}
			base := mustDecode(t, st.Head).Bytes()
			for k := 0; k < 20; k++ {
				fake := cids.Record(fmt.Appendf(nil, "flood %d/%d", i, k)).Bytes()
				_ = g.Publish(ctx, &gossip.Contribution{Experiment: v.cfg.Experiment.ID, Round: st.Round + 1, Base: base, Lease: fake,
					Peer: fh.ID().String(), Delta: fake, Samples: 8, Microshards: []uint32{0}})
				_ = g.Publish(ctx, &gossip.Release{Experiment: v.cfg.Experiment.ID, Round: st.Round + 1, Base: base, Lease: fake,
					Peer: fh.ID().String(), Reason: "flood"})
				sent += 2
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	c.waitDone(2 * time.Minute)
	cancel()
	<-flooded
	c.requireOneChain(c.nodes, rounds)
	st := v.n.Status()
	logs := v.logs.String()
	lines := func(msg, who string) int {
		n := 0
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, msg) && strings.Contains(l, who) {
				n++
			}
		}
		return n
	}
	rejectLines := lines(`msg="contribution rejected"`, fh.ID().String())
	leaseLines := lines(`msg="issued leases"`, "")
	t.Logf("flooder sent %d messages; validator counted %v, logged %d rejection lines, issued leases %d times in %d rounds",
		sent, st.Validator.Rejections, rejectLines, leaseLines, rounds)
	require.Greater(t, st.Validator.Rejections["no_lease"], uint64(20), "every flooded contribution is counted")
	require.LessOrEqual(t, rejectLines, rounds+1, "rejections are logged once per peer and round")
	require.LessOrEqual(t, leaseLines, 2*rounds, "the flood does not make the leader re-lease")
	require.NotContains(t, logs, "released its lease", "a release for a lease the sender does not hold is ignored")
}

// TestEveryTrainerHangingOnceDoesNotStallTheRound: every trainer's worker hangs on its
// second lease, so round 2's first attempt expires with nothing. The leader bars them,
// backs off, and leases to them again in a new pass; while it waits it sends empty grants
// as a heartbeat, so the other validators do not take the round over from it.
func TestEveryTrainerHangingOnceDoesNotStallTheRound(t *testing.T) {
	const rounds = 3
	c := newCluster(t, 2, 3, rounds, 40)
	for _, n := range c.nodes {
		n.cfg.Lease.MinGroup = 3
		n.cfg.Lease.RoundTimeout = 4 * time.Second
		n.cfg.Experiment.Quorum = 2
	}
	// A hung worker's train returns only once a validator has given up on its lease: the
	// deadline passed with nothing from the trainer, which is barred from the attempt.
	for _, n := range c.nodes[2:] {
		var calls atomic.Int32
		self := n.host.ID().String()
		n.rt.Hook = func(pyruntime.TrainJob) error {
			if calls.Add(1) == 2 {
				waitUntil(t.Context(), func() bool { return barredBy(c.nodes[:2], self) })
				return errors.New("worker hung")
			}
			return nil
		}
	}
	c.startAll()
	c.waitDone(2 * time.Minute)
	c.requireOneChain(c.nodes, rounds)
	for _, v := range c.nodes[:2] {
		for _, e := range v.n.Status().Events {
			require.NotEqual(t, "takeover", e.Kind, "%s: %s", v.name, e.Text)
		}
	}
}

// barredBy says whether a validator among vs has barred peer from its open round, or has
// reported it missing its lease's deadline.
func barredBy(vs []*clusterNode, peer string) bool {
	for _, v := range vs {
		st := v.n.Status()
		if st.Validator != nil && st.Validator.Barred[peer] != "" {
			return true
		}
		for _, e := range st.Events {
			if e.Kind == "missing" && strings.Contains(e.Text, peer) {
				return true
			}
		}
	}
	return false
}

// waitUntil returns once cond holds, or when ctx ends; for code outside the test's
// goroutine (a runtime hook), where require.Eventually cannot stop the test.
func waitUntil(ctx context.Context, cond func() bool) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
