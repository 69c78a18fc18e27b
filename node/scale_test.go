package node

import (
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Scale runs: 3 validators (quorum 2) and a fleet of trainers on mocknet, half of them
// twice as fast as the other half. With lease.microshards_per_trainer = scalePerTrainer
// and speed-proportional leases, a fast trainer's relative capacity is 16/12 and a slow
// one's 8/12 of the fleet mean, so once the fleet's capacities are known a fast trainer is
// leased round(6·4/3) = 8 microshards and a slow one round(6·2/3) = 4: exactly twice.
const (
	scaleValidators = 3
	scalePerTrainer = 6
	// scaleFastStep is a fast trainer's modelled step time (a slow one's is synth's 1 ms).
	scaleFastStep = 0.0005
)

// scaleResult is what one scale run measured, as validator-0 recorded it.
type scaleResult struct {
	trainers, rounds int
	// seconds is each round's wall time, head to head (round 1 includes start-up).
	seconds []float64
	// trainSeconds is each round's longest modelled training window.
	trainSeconds []float64
	// fastPerLease and slowPerLease are the mean microshards per merged contribution of the
	// fast and the slow trainers, over the rounds from capacityRound on.
	fastPerLease, slowPerLease float64
	microshards                uint64
}

// capacityRound is the first round whose leases are sized by measured capacities: round 1
// is leased before anyone trained, and round 2 may be granted before every trainer
// announced what it measured in round 1 (trainers announce every 2 s).
const capacityRound = 3

// runScale runs the cluster for the given rounds and checks what a user would check after
// it: every node holds the same head and the same chain, the ledger audit (the code path of
// `p2pnode audit`) proves every microshard merged once, and leases follow capacity.
func runScale(t *testing.T, trainers, rounds int) scaleResult {
	t.Helper()
	require.Zero(t, trainers%2, "half the trainers are fast: use an even number")
	shards := scalePerTrainer * trainers * (rounds + 1) // no epoch tail within the run
	c := newCluster(t, scaleValidators, trainers, rounds, shards)
	fast := map[string]bool{}
	for i, n := range c.nodes {
		n.cfg.Experiment.Quorum = 2
		// Lease only once the whole fleet announced, so every trainer works every round.
		n.cfg.Lease.MinGroup = trainers
		n.cfg.Lease.MicroshardsPerTrainer = scalePerTrainer
		// A round closes as soon as every lease is settled; the deadline only matters for a
		// trainer that is late, which on a loaded test machine (67 nodes in one process,
		// -race) must not be mistaken for one that failed.
		n.cfg.Lease.MinDeadline = 10 * time.Second
		n.cfg.Lease.RoundTimeout = 30 * time.Second
		n.cfg.Protocol.SpeedProportional = true
		n.cfg.Protocol.InnerSteps = 4
		if i >= scaleValidators && (i-scaleValidators)%2 == 1 {
			n.rt.StepSeconds = scaleFastStep
			fast[n.host.ID().String()] = true
		}
		require.NoError(t, n.cfg.Validate())
	}
	start := time.Now()
	if path := os.Getenv("P2PNODE_SCALE_CPUPROFILE"); path != "" {
		// A CPU profile of the run's first minute (start-up and the first rounds), written
		// even if the run does not finish.
		f, err := os.Create(fmt.Sprintf("%s.%d", path, trainers))
		require.NoError(t, err)
		require.NoError(t, pprof.StartCPUProfile(f))
		stop := time.AfterFunc(time.Minute, func() { pprof.StopCPUProfile(); f.Close() })
		t.Cleanup(func() {
			if stop.Stop() {
				pprof.StopCPUProfile()
				f.Close()
			}
		})
	}
	c.startAll()
	c.waitDone(time.Duration(rounds) * 2 * time.Minute)
	t.Logf("%d trainers: %d rounds in %s", trainers, rounds, time.Since(start).Round(time.Millisecond))

	ref := c.nodes[0].n.Status()
	require.Equal(t, uint64(rounds), ref.Round)
	v0, err := OpenStores(c.nodes[0].cfg)
	require.NoError(t, err)
	refIDs, heads, err := v0.Heads.Chain(mustDecode(t, ref.Head))
	require.NoError(t, err)
	require.Len(t, refIDs, rounds+1)
	for _, n := range c.nodes[1:] {
		st := n.n.Status()
		require.Equal(t, ref.Head, st.Head, "%s holds another head", n.name)
		s, err := OpenStores(n.cfg)
		require.NoError(t, err)
		ids, _, err := s.Heads.Chain(mustDecode(t, st.Head))
		require.NoError(t, err, n.name)
		require.Equal(t, refIDs, ids, "%s: head chains differ", n.name)
	}

	rep, err := v0.Audit(mustDecode(t, ref.Head))
	require.NoError(t, err)
	require.Zero(t, rep.Lost, "audit: microshards lost")
	require.Zero(t, rep.Duplicated, "audit: microshards duplicated")
	require.Equal(t, rounds+1, rep.Heads)
	require.Equal(t, uint64(rep.ConsumedInEpoch), rep.MicroshardsMerged, "one epoch, not completed: the ledger holds what was merged")

	res := scaleResult{trainers: trainers, rounds: rounds, microshards: rep.MicroshardsMerged}
	var fastN, slowN, fastShards, slowShards int
	merged := map[string]bool{}
	for _, h := range heads[1:] {
		if len(h.Contributions) < trainers {
			t.Logf("%d trainers: round %d merged %d contributions", trainers, h.Round, len(h.Contributions))
		}
		for _, ct := range h.Contributions {
			merged[ct.Peer] = true
		}
		if h.Round < capacityRound {
			continue
		}
		for _, ct := range h.Contributions {
			if fast[ct.Peer] {
				fastN, fastShards = fastN+1, fastShards+len(ct.Microshards)
			} else {
				slowN, slowShards = slowN+1, slowShards+len(ct.Microshards)
			}
		}
	}
	require.Len(t, merged, trainers, "every trainer had work merged")
	if fastN > 0 && slowN > 0 {
		res.fastPerLease, res.slowPerLease = float64(fastShards)/float64(fastN), float64(slowShards)/float64(slowN)
	}
	st := c.nodes[0].n.Status()
	for _, p := range st.History[1:] {
		res.seconds = append(res.seconds, p.Seconds)
	}
	// The longest window of a round is the slowest trainer's: steps × its step time.
	for _, h := range heads[1:] {
		longest := 0.0
		for _, ct := range h.Contributions {
			step := 0.001
			if fast[ct.Peer] {
				step = scaleFastStep
			}
			longest = max(longest, float64(ct.Samples)/8*step) // synth trains batches of 8
		}
		res.trainSeconds = append(res.trainSeconds, longest)
	}
	return res
}

// checkCapacitySpread asserts that the fast trainers' leases were twice the slow ones'. With
// every capacity known the shares are exactly 8 and 4 microshards (see the constants); the
// tolerance of ±10 % leaves room for a trainer's announcement arriving after a round's grant
// (announcements and contributions travel on different topics): it then counts as average
// and gets 6, which moves its class's mean by 2/(trainers/2 · (rounds − 2)) microshards —
// 0.03 of 8 (under 1 %) at 16 trainers and 10 rounds, so the ratio stays within 1.8–2.2
// unless several trainers are a round late.
func checkCapacitySpread(t *testing.T, r scaleResult) {
	t.Helper()
	require.Positive(t, r.slowPerLease)
	ratio := r.fastPerLease / r.slowPerLease
	t.Logf("%d trainers: fast trainers got %.2f microshards a lease, slow ones %.2f (ratio %.2f; capacity ratio 2)",
		r.trainers, r.fastPerLease, r.slowPerLease, ratio)
	require.InDelta(t, 2.0, ratio, 0.2, "leases follow capacity: fast %.2f, slow %.2f", r.fastPerLease, r.slowPerLease)
}

// TestMocknetScale16Trainers is the 16-trainer scale run of `make test` (issue 16 item 4):
// 3 validators and 16 trainers for 5 rounds (rounds 3 to 5 check the capacity spread),
// with every check of runScale. It runs only with P2PNODE_SCALE_16=1, which `make test`
// sets in a step of its own after every package's tests: inside the `go test ./...` of a
// clean-clone `make test`, beside the e2e package's real processes, it failed 2 of 2 runs
// (170 s and 231 s for the 5 rounds, 1-11 of 16 contributions merged a round, one trainer
// never merged): its 19 in-process nodes starve for CPU there. Alone on the shared 2-core
// machine under -race it passed in 28-112 s.
func TestMocknetScale16Trainers(t *testing.T) {
	if os.Getenv("P2PNODE_SCALE_16") == "" {
		t.Skip("set P2PNODE_SCALE_16=1 to run the 16-trainer scale cluster")
	}
	checkCapacitySpread(t, runScale(t, 16, 5))
}

// TestMocknetScaleOverhead runs the scale cluster for each fleet size in
// P2PNODE_SCALE_TRAINERS (e.g. "4,16,64"), P2PNODE_SCALE_ROUNDS rounds each (default 10),
// and logs a table of round overhead: wall seconds per round, head to head, against the
// training time inside it. No timing is asserted; the correctness checks of runScale are.
func TestMocknetScaleOverhead(t *testing.T) {
	spec := os.Getenv("P2PNODE_SCALE_TRAINERS")
	if spec == "" {
		t.Skip("set P2PNODE_SCALE_TRAINERS (e.g. 4,16,64) to run the scale table")
	}
	rounds := 10
	if s := os.Getenv("P2PNODE_SCALE_ROUNDS"); s != "" {
		var err error
		rounds, err = strconv.Atoi(s)
		require.NoError(t, err, "P2PNODE_SCALE_ROUNDS")
	}
	var results []scaleResult
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err, "P2PNODE_SCALE_TRAINERS")
		t.Run(fmt.Sprintf("trainers=%d", n), func(t *testing.T) {
			r := runScale(t, n, rounds)
			checkCapacitySpread(t, r)
			results = append(results, r)
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%8s %6s %11s %9s %9s %9s %9s %14s %10s\n", "trainers", "rounds", "microshards",
		"round1 s", "median s", "mean s", "max s", "train s/round", "overhead")
	for _, r := range results {
		later := slices.Clone(r.seconds[1:])
		slices.Sort(later)
		var train, total float64
		for i := 1; i < len(r.seconds); i++ {
			train, total = train+r.trainSeconds[i], total+r.seconds[i]
		}
		k := float64(len(later))
		fmt.Fprintf(&b, "%8d %6d %11d %9.2f %9.2f %9.2f %9.2f %14.4f %9.1f%%\n", r.trainers, r.rounds, r.microshards,
			r.seconds[0], later[len(later)/2], total/k, later[len(later)-1], train/k, 100*(total-train)/total)
	}
	t.Logf("round overhead (rounds 2..%d; round 1 includes start-up and waiting for the fleet):%s", rounds, b.String())
}
