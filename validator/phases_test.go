package validator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/headsync"
	"github.com/p2pnode/p2pnode/internal/testenv"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/round"
	"github.com/p2pnode/p2pnode/synth"
)

// phaseSink is a testSink that also records every phase the validator enters, in order.
type phaseSink struct {
	testSink
	pmu    sync.Mutex
	phases []Phase
}

func (s *phaseSink) Status(fn func(*Status)) {
	s.testSink.Status(func(st *Status) {
		fn(st)
		if p := st.Phase; p != nil {
			s.pmu.Lock()
			if n := len(s.phases); n == 0 || s.phases[n-1] != *p {
				s.phases = append(s.phases, *p)
			}
			s.pmu.Unlock()
		}
	})
}

// walk is the phases entered, as "name round", consecutive repeats folded.
func (s *phaseSink) walk() []string {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	var out []string
	for _, p := range s.phases {
		if e := fmt.Sprintf("%s %d", p.Name, p.Round); len(out) == 0 || out[len(out)-1] != e {
			out = append(out, e)
		}
	}
	return out
}

// phaseSwarm is validators on one in-memory network, with the synthetic workload's
// dataset and model and one artifact store between them (the tests are about the
// validators' phases, not about moving artifacts), and a trainer the test plays.
type phaseSwarm struct {
	t       *testing.T
	ctx     context.Context
	dir     string
	cfg     config.Config
	plan    *dataset.Plan
	shards  *dataset.ShardStore
	store   *artifact.Store
	rt      *synth.Runtime
	policy  round.Policy
	trainer string
	// started is the process start the trainer announces (0: none); a change is a restart.
	started int64
	// reference, when set, is the validators' reference trainer (Params.Reference).
	reference ReferenceTrainer
	nodes     []*phaseNode
	// published is every message a validator published, for the test to read.
	published chan published
}

type published struct {
	from string
	msg  any
}

// phaseNode is one validator of the swarm, with the head sync that makes heads canonical
// on it as their signatures arrive (as in a node).
type phaseNode struct {
	self string
	v    *Validator
	sync *headsync.Sync
	sink *phaseSink
	bus  *netBus
	done chan error
}

// netBus carries what a validator publishes to every other validator of the swarm, as a
// copy decoded from its encoding (as gossip would deliver it), and to the test.
type netBus struct {
	bus.Fanout
	self string
	net  *phaseSwarm
	// gate, when set, holds this validator's fetches until it is closed (a slow link);
	// gated counts the fetches held.
	gate  atomic.Pointer[chan struct{}]
	gated atomic.Int32
	// unreachable, when set, is a peer this validator cannot dial (behind NAT, say): a
	// fetch whose every holder hint is that peer fails.
	unreachable atomic.Pointer[peer.ID]
	// unsubscribed, when set, is a peer whose subscription to the leases topic has not
	// reached this validator yet (it was heard through another peer).
	unsubscribed atomic.Pointer[string]
}

func (b *netBus) Reach(msg any) func(string) bool {
	u := b.unsubscribed.Load()
	_, leases := msg.(*gossip.Leases)
	return func(p string) bool { return !leases || u == nil || p != *u }
}

func (b *netBus) Publish(_ context.Context, msg any) error {
	for _, n := range b.net.nodes {
		if n.self == b.self {
			continue
		}
		c, err := wireCopy(msg)
		if err != nil {
			return err
		}
		n.bus.Deliver(b.self, c)
	}
	select {
	case b.net.published <- published{b.self, msg}:
	default: // heartbeats the test does not read
	}
	return nil
}

// FetchAtMost is Fetch, refusing an artifact its manifest says is larger than max as the
// artifact exchange does.
func (b *netBus) FetchAtMost(ctx context.Context, id cid.Cid, max uint64, hints ...peer.ID) error {
	if m, err := b.net.store.Manifest(id); err == nil && max > 0 && m.Size > max {
		return fmt.Errorf("fetch %s: %w: %d bytes, at most %d", id, artifact.ErrTooLarge, m.Size, max)
	}
	return b.Fetch(ctx, id, hints...)
}

func (b *netBus) Fetch(ctx context.Context, id cid.Cid, hints ...peer.ID) error {
	if u := b.unreachable.Load(); u != nil && len(hints) > 0 && !slices.ContainsFunc(hints, func(h peer.ID) bool { return h != *u }) {
		return fmt.Errorf("fetch %s: holder unreachable: failed to dial %s: no addresses", id, *u)
	}
	if g := b.gate.Load(); g != nil {
		b.gated.Add(1)
		select {
		case <-*g:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if !b.net.store.Has(id) {
		return fmt.Errorf("fetch %s: not held", id)
	}
	return nil
}

// wireCopy is msg encoded and decoded again, as another node reads it.
func wireCopy(msg any) (any, error) {
	b, err := gossip.Encode(msg)
	if err != nil {
		return nil, err
	}
	switch msg.(type) {
	case *gossip.Announce:
		return gossip.DecodeAnnounce(b)
	case *gossip.Leases:
		return gossip.DecodeLeases(b)
	case *gossip.Contribution:
		return gossip.DecodeContribution(b)
	case *gossip.Release:
		return gossip.DecodeRelease(b)
	case *gossip.Attestation:
		return gossip.DecodeAttestation(b)
	case *gossip.Head:
		m, _, err := gossip.DecodeHead(b)
		return m, err
	}
	return nil, fmt.Errorf("unknown message %T", msg)
}

func newPhaseSwarm(t *testing.T, rounds int) *phaseSwarm {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	require.NoError(t, synth.WriteDataset(data, 6, 1))
	m, err := dataset.Build(data, "synth", 1<<20)
	require.NoError(t, err)
	cfg := config.Default()
	cfg.Experiment.ID = "phases"
	cfg.Experiment.Rounds = rounds
	cfg.Dataset.MicroshardBytes = 256
	cfg.Protocol.InnerSteps = 5
	cfg.Lease.MicroshardsPerTrainer = 2
	cfg.Lease.MinGroup = 1
	cfg.Lease.FirstDeadline = 5 * time.Second // the trainer the test plays is quick
	s := &phaseSwarm{t: t, ctx: t.Context(), dir: dir, cfg: *cfg, published: make(chan published, 256),
		policy: round.Policy{Kind: cfg.Protocol.MergePolicy, Codec: diloco.FP32, Aggregator: merge.AggMean,
			Outer: diloco.OuterConfig{LR: 1, Momentum: 0.5}}}
	s.plan, err = dataset.NewPlan(m, cfg.Dataset.MicroshardBytes)
	require.NoError(t, err)
	s.store, err = artifact.OpenStore(filepath.Join(dir, "artifacts"), artifact.Options{})
	require.NoError(t, err)
	s.shards, err = dataset.NewShardStore(s.store, data, m, nil)
	require.NoError(t, err)
	s.rt = synth.New(filepath.Join(dir, "scratch"))
	_, err = s.rt.Start(s.ctx)
	require.NoError(t, err)
	_, s.trainer = testenv.Key(t, "phase trainer")
	return s
}

// start runs validators named names, all of them the experiment's validators, with a
// quorum of quorum.
func (s *phaseSwarm) start(quorum int, names ...string) {
	t := s.t
	t.Helper()
	keys := map[string]crypto.PrivKey{}
	var validators []string
	for _, name := range names {
		k, id := testenv.Key(t, name)
		keys[id] = k
		validators = append(validators, id)
	}
	for _, self := range validators {
		cfg := s.cfg
		cfg.Node.StoreDir = filepath.Join(s.dir, self)
		require.NoError(t, os.MkdirAll(cfg.Node.StoreDir, 0o755))
		heads, err := chain.OpenStore(filepath.Join(cfg.Node.StoreDir, "heads"))
		require.NoError(t, err)
		n := &phaseNode{self: self, sink: &phaseSink{}, bus: &netBus{self: self, net: s}, done: make(chan error, 1)}
		n.v, err = New(Params{Config: &cfg, Self: self, Key: keys[self], Validators: validators, Bus: n.bus,
			Tips: chain.NewTips(heads, validators, quorum), Heads: heads, Store: s.store,
			Merger: &round.Merger{Store: s.store, Policy: s.policy}, Runtime: s.rt, Plan: s.plan, PlanID: s.plan.ID().String(),
			Reference: s.reference,
			FetchHead: func(context.Context, *chain.Head, ...peer.ID) error { return nil },
			Sink:      n.sink, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("validator", self[len(self)-6:])})
		require.NoError(t, err)
		n.sync = headsync.New(headsync.Params{Experiment: cfg.Experiment.ID, Self: self,
			IsValidator: func(p string) bool { return slices.Contains(validators, p) }, Bus: n.bus, Tips: n.v.v.Tips,
			Heads: heads, Peers: noPeers{}, FetchArtifacts: n.v.v.FetchHead, Log: n.v.v.Log})
		s.nodes = append(s.nodes, n)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	synced := make(chan error, len(s.nodes))
	for _, n := range s.nodes {
		go func() { n.done <- n.v.Run(ctx) }()
		go func() { synced <- n.sync.Run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for _, n := range s.nodes {
			require.ErrorIs(t, <-n.done, context.Canceled)
			require.ErrorIs(t, <-synced, context.Canceled)
		}
	})
}

// byIssuer is the swarm's two validators: the one named issuer (a grant's), then the other.
func (s *phaseSwarm) byIssuer(issuer string) (named, other *phaseNode) {
	named, other = s.nodes[0], s.nodes[1]
	if named.self != issuer {
		named, other = other, named
	}
	return named, other
}

// waitFor waits until validator n has entered phase (as "name round").
func (s *phaseSwarm) waitFor(n *phaseNode, phase string) {
	s.t.Helper()
	deadline := time.After(30 * time.Second)
	for !slices.Contains(n.sink.walk(), phase) {
		select {
		case err := <-n.done:
			s.t.Fatalf("validator stopped before %s: %v", phase, err)
		case <-deadline:
			s.t.Fatalf("no %s; phases %v", phase, n.sink.walk())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// train plays the trainer for one round (lease, then contribute). It returns the lease's
// issuer.
func (s *phaseSwarm) train() string {
	s.t.Helper()
	grant := s.lease()
	s.contribute(grant)
	return grant.Issuer
}

// lease announces the trainer to every validator until one grants it a lease, and returns
// the grant.
func (s *phaseSwarm) lease() *gossip.Leases {
	s.t.Helper()
	return s.leaseWith(func() {
		for _, n := range s.nodes {
			id, h := n.v.v.Tips.Current()
			s.announce(n, id, h)
		}
	})
}

// leaseWith is lease with the trainer's announcements made by announce.
func (s *phaseSwarm) leaseWith(announce func()) *gossip.Leases {
	t := s.t
	t.Helper()
	var grant *gossip.Leases
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for grant == nil {
		select {
		case p := <-s.published:
			if l, ok := p.msg.(*gossip.Leases); ok && len(l.Leases) > 0 {
				grant = l
			}
		case <-tick.C:
			announce()
		case <-deadline:
			t.Fatal("no lease granted")
		}
	}
	require.Len(t, grant.Leases, 1)
	return grant
}

// announce delivers the trainer's announcement to n, naming head h (id) as the trainer's
// (none: nil).
func (s *phaseSwarm) announce(n *phaseNode, id cid.Cid, h *chain.Head) {
	a := &gossip.Announce{Experiment: s.cfg.Experiment.ID, Peer: s.trainer, Roles: []string{config.RoleTrainer},
		Time: time.Now().UnixMilli(), Capacity: 1, Started: s.started}
	if h != nil {
		a.Head, a.Round = id.Bytes(), h.Round
	}
	n.bus.Deliver(s.trainer, a)
}

// contribute trains the window of grant's lease on its base and announces the
// contribution to every validator.
func (s *phaseSwarm) contribute(grant *gossip.Leases) {
	t := s.t
	t.Helper()
	l := grant.Leases[0]
	require.Equal(t, s.trainer, l.Trainer)
	baseID, err := cid.Cast(l.Base)
	require.NoError(t, err)
	_, base, err := s.nodes[0].v.v.Heads.Get(baseID)
	require.NoError(t, err)
	require.NoError(t, l.Check(baseID, base))
	work := &round.Trainer{Runtime: s.rt, Store: s.store, Shards: dataset.PlanFiles{Plan: s.plan, Shards: s.shards}, Codec: s.policy.Codec}
	res, err := work.Train(s.ctx, base, l.Microshards, int(l.Steps), 1)
	require.NoError(t, err)
	for _, n := range s.nodes {
		n.bus.Deliver(s.trainer, &gossip.Contribution{Experiment: s.cfg.Experiment.ID, Round: l.Round, Base: l.Base,
			Lease: l.ID().Bytes(), Peer: s.trainer, Delta: res.Delta.Bytes(), Samples: res.Samples, Loss: res.Loss,
			Microshards: l.Microshards, Seconds: res.Seconds, TrainSeconds: res.TrainSeconds})
	}
}

// canonical waits until every validator's canonical head is of round r, and returns it.
func (s *phaseSwarm) canonical(r uint64) *chain.Head {
	s.t.Helper()
	var h *chain.Head
	require.Eventually(s.t, func() bool {
		for _, n := range s.nodes {
			if _, h = n.v.v.Tips.Current(); h == nil || h.Round != r {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "round %d never became canonical everywhere", r)
	return h
}

// The leader's walk through round 1 (issuing is also where it decides that the attempt's
// contributions are in and the round closes, so it comes back to it before proposing).
var leaderWalk = []string{"issuing 1", "collecting 1", "issuing 1", "proposing 1", "awaiting_quorum 1"}

// TestLeaderWalksItsPhases: a lone validator (quorum 1) on the synthetic workload makes
// genesis and leads round 1 through its named phases, each reported to its sink as it
// enters it: issuing (it heard no trainer yet, so it waits), collecting (a trainer's
// announcement got a lease), issuing again (the trainer's contribution arrived: the round
// closes), proposing, and awaiting_quorum on its own proposal, which its signature alone
// makes canonical. With the experiment's last round reached, it stays there.
func TestLeaderWalksItsPhases(t *testing.T) {
	s := newPhaseSwarm(t, 1)
	s.start(1, "phase validator")
	n := s.nodes[0]
	s.waitFor(n, "issuing 1") // until the trainer is heard the leader waits, issuing
	s.train()
	h := s.canonical(1)
	require.Len(t, h.Contributions, 1)
	require.Equal(t, s.trainer, h.Contributions[0].Peer)
	s.waitFor(n, "awaiting_quorum 1")
	walk := n.sink.walk()
	require.Equal(t, leaderWalk, walk, "phases %v", walk)
}

// TestFollowerWalksItsPhases: two validators, a quorum of both. The one that makes genesis
// (the first by peer ID) waits for the other's attestation (awaiting_quorum 0); the other
// waits for genesis (waiting 0) and attests it. Round 1's leader walks the leader's phases;
// the other follows (following 1), recomputes the proposal, attests it and waits for the
// quorum with it (awaiting_quorum 1).
func TestFollowerWalksItsPhases(t *testing.T) {
	s := newPhaseSwarm(t, 1)
	s.start(2, "phase validator A", "phase validator B")
	maker, other := s.nodes[0], s.nodes[1]
	if other.self < maker.self {
		maker, other = other, maker
	}
	s.canonical(0)
	issuer := s.train()
	h := s.canonical(1)
	require.Len(t, h.Contributions, 1)
	leader, follower := s.byIssuer(issuer)
	s.waitFor(leader, "awaiting_quorum 1")
	s.waitFor(follower, "awaiting_quorum 1")
	require.Equal(t, "waiting 0", other.sink.walk()[0], "phases %v", other.sink.walk())
	require.Equal(t, "awaiting_quorum 0", maker.sink.walk()[0], "phases %v", maker.sink.walk())
	lw, fw := leader.sink.walk(), follower.sink.walk()
	i := slices.Index(lw, "issuing 1")
	require.GreaterOrEqual(t, i, 0, "leader's phases %v", lw)
	require.Equal(t, leaderWalk, lw[i:], "leader's phases %v", lw)
	j := slices.Index(fw, "following 1")
	require.GreaterOrEqual(t, j, 0, "follower's phases %v", fw)
	require.Equal(t, []string{"following 1", "awaiting_quorum 1"}, fw[j:], "follower's phases %v", fw)
}

// TestFollowerReadsWhileItChecks: two validators, a quorum of both. The follower's fetch
// of round 1's update hangs (a slow link) while it checks the leader's proposal. Meanwhile
// it goes on reading its inbox — a trainer that announces itself now is live to it at
// once — and it does not take the round over, though the leader, having proposed, sends
// nothing but its proposal again until well past the time a silent leader is passed over.
// Once the update arrives, it attests the proposal, and round 1 is canonical everywhere.
func TestFollowerReadsWhileItChecks(t *testing.T) {
	s := newPhaseSwarm(t, 1)
	s.start(2, "phase validator A", "phase validator B")
	s.canonical(0)
	grant := s.lease()
	leader, follower := s.byIssuer(grant.Issuer)
	gate := make(chan struct{})
	follower.bus.gate.Store(&gate)
	s.contribute(grant)
	s.waitFor(leader, "awaiting_quorum 1")
	require.Eventually(t, func() bool { return follower.bus.gated.Load() > 0 }, 30*time.Second, 10*time.Millisecond,
		"the follower never fetched the proposal's update")

	_, newcomer := testenv.Key(t, "phase newcomer")
	follower.bus.Deliver(newcomer, &gossip.Announce{Experiment: s.cfg.Experiment.ID, Peer: newcomer,
		Roles: []string{config.RoleTrainer}, Time: time.Now().UnixMilli(), Capacity: 1})
	require.Eventually(t, func() bool { return follower.v.v.trainers.isLive(newcomer) }, 5*time.Second, 10*time.Millisecond,
		"the follower read nothing while it checked the proposal")

	// A follower passes over a leader silent for LeaseWait past its grant's deadline (and
	// its last heartbeat's); this one waits well beyond that, for the check's verdict.
	until := time.UnixMilli(grant.Deadline).Add(LeaseGrace + LeaseWait + 2*time.Second)
	if d := time.Now().Add(LeaseWait + 2*heartbeatEvery + LeaseGrace + 2*time.Second); d.After(until) {
		until = d
	}
	for wait := time.After(time.Until(until)); ; {
		select {
		case p := <-s.published:
			if l, ok := p.msg.(*gossip.Leases); ok && p.from == follower.self {
				t.Fatalf("the follower took round %d over while it checked the leader's proposal (grant of %d leases)", l.Round, len(l.Leases))
			}
			continue
		case <-wait:
		}
		break
	}
	fw := follower.sink.walk()
	require.Equal(t, "following 1", fw[len(fw)-1], "follower's phases %v", fw)

	close(gate)
	h := s.canonical(1)
	require.Len(t, h.Contributions, 1)
	require.Equal(t, s.trainer, h.Contributions[0].Peer)
	s.waitFor(follower, "awaiting_quorum 1")
}

// TestLeaderStandsAsideAndRetakes: two validators, a quorum of both. Round 1's leader,
// issuing (it hears no trainer yet), hears the other validator — the later one in the
// round's order — grant round 1 on the same base: a takeover. It stands aside
// (standing_aside 1). The other sends nothing more (it has no trainer to lead either), so
// once its silence window has passed the leader leads the round again (issuing 1), and the
// round closes with it.
func TestLeaderStandsAsideAndRetakes(t *testing.T) {
	s := newPhaseSwarm(t, 1)
	s.start(2, "phase validator A", "phase validator B")
	s.canonical(0)
	baseID, _ := s.nodes[0].v.v.Tips.Current()
	order := lease.Leaders(s.nodes[0].v.v.Validators, baseID)
	leader, other := s.nodes[0], s.nodes[1]
	if leader.self != order[0] {
		leader, other = other, leader
	}
	s.waitFor(leader, "issuing 1")
	leader.bus.Deliver(other.self, &gossip.Leases{Experiment: s.cfg.Experiment.ID, Round: 1, Base: baseID.Bytes(), Issuer: other.self,
		Deadline: time.Now().Add(time.Second).UnixMilli(), Attempt: 1 << 16})
	s.waitFor(leader, "standing_aside 1")
	require.Eventually(t, func() bool {
		w := leader.sink.walk()
		i := slices.Index(w, "standing_aside 1")
		return i >= 0 && slices.Contains(w[i:], "issuing 1")
	}, 30*time.Second, 10*time.Millisecond, "the leader never led the round again")
	require.Equal(t, leader.self, s.train(), "the lease was not the retaking leader's")
	h := s.canonical(1)
	require.Len(t, h.Contributions, 1)
	w := leader.sink.walk()
	i := slices.Index(w, "issuing 1")
	require.Equal(t, []string{"issuing 1", "standing_aside 1", "issuing 1", "collecting 1", "issuing 1", "proposing 1", "awaiting_quorum 1"}, w[i:],
		"leader's phases %v", w)
}

// noPeers is a network without the chain sync protocol: heads arrive by gossip only.
type noPeers struct{}

func (noPeers) Connected() []peer.ID   { return nil }
func (noPeers) Reachable(peer.ID) bool { return false }
func (noPeers) RequestTip(context.Context, peer.ID) (*chain.Fetched, error) {
	return nil, errors.New("no chain sync here")
}
func (noPeers) RequestHead(context.Context, peer.ID, cid.Cid) (*chain.Fetched, error) {
	return nil, errors.New("no chain sync here")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }

// TestLeaderThatCannotFetchHandsTheRoundOn: two validators, a quorum of both (so the
// other cannot pass over a leader it still hears). Round 1's leader cannot dial the
// trainer (it is behind NAT and dialed only the other validator): the trainer's update
// is unavailable to it. Once that pass has failed, the leader hands the round on
// (standing_aside 1, its heartbeats stopped); the other validator takes the round over,
// leases to the trainer, fetches its update and proposes; the first checks the proposal
// with the update fetched from the proposer and attests it. Before, the leader readmitted
// the trainer and leased again, pass after pass, and the round never closed.
func TestLeaderThatCannotFetchHandsTheRoundOn(t *testing.T) {
	s := newPhaseSwarm(t, 1)
	s.start(2, "phase validator A", "phase validator B")
	s.canonical(0)
	grant := s.lease()
	leader, other := s.byIssuer(grant.Issuer)
	trainer := mustPeer(t, s.trainer)
	leader.bus.unreachable.Store(&trainer)
	s.contribute(grant)
	s.waitFor(leader, "standing_aside 1")
	require.Equal(t, other.self, s.train(), "the next lease was not the other validator's")
	h := s.canonical(1)
	require.Len(t, h.Contributions, 1)
	require.Equal(t, s.trainer, h.Contributions[0].Peer)
	require.Contains(t, other.sink.walk(), "proposing 1", "the other validator proposed the round")
	s.waitFor(leader, "awaiting_quorum 1")
	w := leader.sink.walk()
	i := slices.Index(w, "standing_aside 1")
	require.Equal(t, []string{"standing_aside 1", "awaiting_quorum 1"}, w[i:], "leader's phases %v", w)
}

// TestWindowsSlowerThanTheirPaceStillCloseTheRound: a lone validator has seen the trainer's
// quick window in round 1, so round 2's first attempt gets a short deadline (three such
// windows and the slack). Then the trainer slows down (a machine under load): every window
// now takes one and a half of that deadline. A trainer that stayed and let its lease
// expire gets at least twice the deadline it missed, so the second attempt of round 2 is
// long enough and the window arrives in it. Before, a pace observed while the machine was
// idle set every attempt's deadline (only attempts leased with no pace known were
// doubled), so the round was leased again and again at the short deadline for as long as
// the load lasted.
func TestWindowsSlowerThanTheirPaceStillCloseTheRound(t *testing.T) {
	s := newPhaseSwarm(t, 2)
	s.cfg.Lease.MinDeadline = time.Second
	s.start(1, "phase validator")
	s.train()
	s.canonical(1)
	var windows []time.Duration
	var slow time.Duration
	for attempt := 1; ; attempt++ {
		require.LessOrEqual(t, attempt, 3, "round 2 still open after %d attempts; deadlines %v", attempt-1, windows)
		grant := s.lease()
		w := time.Until(time.UnixMilli(grant.Deadline))
		windows = append(windows, w)
		if slow == 0 {
			slow = w * 3 / 2
		}
		if w < slow {
			time.Sleep(w + 100*time.Millisecond) // the window runs past the deadline
			continue
		}
		time.Sleep(slow)
		s.contribute(grant)
		break
	}
	h := s.canonical(2)
	require.Len(t, h.Contributions, 1)
	t.Logf("round 2's attempts' deadlines: %v", windows)
}

// TestRestartedTrainerIsNotGivenALongerDeadline: the trainer lets round 2's first lease
// expire, as a process that was killed mid-window does, and comes back as a new process.
// Its silence said nothing of the deadline, so its next lease gets the deadline of its pace
// again, not twice the one it missed (which, with no pace known, is twice
// lease.first_deadline: a minute where the round should take seconds).
func TestRestartedTrainerIsNotGivenALongerDeadline(t *testing.T) {
	s := newPhaseSwarm(t, 2)
	s.cfg.Lease.MinDeadline = time.Second
	s.started = time.Now().UnixMilli()
	s.start(1, "phase validator")
	s.train()
	s.canonical(1)
	first := s.lease()
	missed := time.Until(time.UnixMilli(first.Deadline))
	time.Sleep(missed + 100*time.Millisecond) // killed: silent past the deadline
	s.started++                               // and started again
	again := s.lease()
	require.Greater(t, again.Attempt, first.Attempt)
	w := time.Until(time.UnixMilli(again.Deadline))
	require.Less(t, w, missed*3/2, "the restarted trainer's lease: %v; the one it missed: %v", w, missed)
	s.contribute(again)
	require.Len(t, s.canonical(2).Contributions, 1)
}

// TestLeaderLeasesOnlyTrainersItsGrantsReach: a trainer back from a restart, heard before its
// subscription to the leases topic reached the leader (its announcement came through
// another peer), is not leased at once — a grant published then would not reach it, and the
// attempt would wait for it until its deadline — but once its subscription is in. One that
// the leader's grants never reach directly (behind NAT, no connection to it) is leased
// after reachGrace, when gossip forwards the grant to it.
func TestLeaderLeasesOnlyTrainersItsGrantsReach(t *testing.T) {
	for _, tc := range []struct {
		name       string
		subscribes bool // its subscription arrives after the wait
	}{
		{"its subscription arrives", true},
		{"never directly reached", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, n := restartedInRound(t, 2)
			n.bus.unsubscribed.Store(&s.trainer) // heard through another peer
			back := time.Now()
			id, h := n.v.v.Tips.Current()
			s.notLeasedFor(n, reachGrace*3/4, "a lease for a trainer the grant does not reach", func() { s.announce(n, id, h) })
			if tc.subscribes {
				n.bus.unsubscribed.Store(nil)
			}
			grant := s.lease()
			if !tc.subscribes {
				require.GreaterOrEqual(t, time.Since(back), reachGrace)
			}
			s.contribute(grant)
			require.Len(t, s.canonical(2).Contributions, 1)
		})
	}
}

// restartedInRound is a lone validator's swarm whose trainer trained the rounds before
// round, took round's lease and restarted (the leader settles the lost lease at its next
// announcement, which the test makes).
func restartedInRound(t *testing.T, round uint64) (*phaseSwarm, *phaseNode) {
	s := newPhaseSwarm(t, int(round))
	s.started = time.Now().UnixMilli()
	s.start(1, "phase validator")
	for r := uint64(1); r < round; r++ {
		s.train()
		s.canonical(r)
	}
	s.lease()
	s.started++
	return s, s.nodes[0]
}

// notLeased has announce called every 200 ms, for longer than the wait for the fleet's
// announcements (gossip.AnnounceEvery) and a young chain's join grace, after which a
// trainer the leader may lease is leased at once (TestLeaderWalksItsPhases), and fails
// with why on a lease.
func (s *phaseSwarm) notLeased(n *phaseNode, why string, announce func()) {
	s.t.Helper()
	s.notLeasedFor(n, 2*gossip.AnnounceEvery+time.Second, why, announce)
}

// notLeasedFor is notLeased for d.
func (s *phaseSwarm) notLeasedFor(n *phaseNode, d time.Duration, why string, announce func()) {
	s.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		announce()
		select {
		case p := <-s.published:
			if l, ok := p.msg.(*gossip.Leases); ok {
				require.Empty(s.t, l.Leases, why)
			}
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestLeaderDoesNotLeaseATrainerCatchingUp: a trainer whose announcement names no head past
// genesis — a joiner still downloading the model — is not leased: it could not train on the
// round's base in time, and the missed leases would quarantine it. Once it announces a head,
// even an old one (it rebuilds the rest while its lease waits for the base), it is.
func TestLeaderDoesNotLeaseATrainerCatchingUp(t *testing.T) {
	s, n := restartedInRound(t, 3)
	tip, _ := n.v.v.Tips.Current()
	ids, heads, err := n.v.v.Heads.Chain(tip)
	require.NoError(t, err)
	require.Len(t, heads, 3)
	s.notLeased(n, "a lease for a trainer without a head", func() { s.announce(n, cid.Undef, nil) })
	s.contribute(s.leaseWith(func() { s.announce(n, ids[0], heads[0]) })) // genesis
	require.Len(t, s.canonical(3).Contributions, 1)
}
