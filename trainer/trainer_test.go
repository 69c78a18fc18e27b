package trainer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
)

const (
	self      = "trainer-self"
	validator = "validator-1"
)

// testBus delivers what the test injects and hands what the trainer publishes to a
// channel; fetches succeed unless fetchErr is set.
type testBus struct {
	bus.Fanout
	published  chan any
	subscribed chan struct{}
	fetchErr   error
}

func (b *testBus) Subscribe() *bus.Inbox {
	in := b.Fanout.Subscribe()
	b.subscribed <- struct{}{}
	return in
}

func (b *testBus) Publish(_ context.Context, msg any) error { b.published <- msg; return nil }
func (b *testBus) Fetch(context.Context, cid.Cid, ...peer.ID) error {
	return b.fetchErr
}
func (b *testBus) FetchAtMost(context.Context, cid.Cid, uint64, ...peer.ID) error {
	return b.fetchErr
}

// testChain is a settable canonical head over a map of stored heads.
type testChain struct {
	mu      sync.Mutex
	id      cid.Cid
	head    *chain.Head
	stored  map[cid.Cid]*chain.Head
	changed chan struct{}
}

func (c *testChain) Current() (cid.Cid, *chain.Head) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.id, c.head
}

func (c *testChain) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *testChain) Head(id cid.Cid) (*chain.Head, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.stored[id]; ok {
		return h, nil
	}
	return nil, chain.ErrNotFound
}

func (c *testChain) add(h *chain.Head) cid.Cid {
	id, err := h.ID()
	if err != nil {
		panic(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stored[id] = h
	return id
}

func (c *testChain) set(id cid.Cid) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.id, c.head = id, c.stored[id]
	close(c.changed)
	c.changed = make(chan struct{})
}

// testWindow records its calls and fails when err is set.
type testWindow struct {
	mu    sync.Mutex
	calls []windowCall
	err   error
}

type windowCall struct {
	round       uint64
	microshards []uint32
	steps       int
	seed        int64
}

func (w *testWindow) Train(_ context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*round.Result, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, windowCall{base.Round + 1, microshards, steps, seed})
	if w.err != nil {
		return nil, w.err
	}
	return &round.Result{Delta: cids.Raw([]byte{byte(len(w.calls))}), Samples: 40, Loss: 1.5, Seconds: 2, TrainSeconds: 1,
		Steps: steps, OptState: "opt.pt"}, nil
}

// testSink records what the trainer reports.
type testSink struct {
	mu      sync.Mutex
	holding []*Held
	trained []Trained
	events  []string
}

func (s *testSink) Holding(l *Held) { s.mu.Lock(); s.holding = append(s.holding, l); s.mu.Unlock() }
func (s *testSink) Trained(t Trained) {
	s.mu.Lock()
	s.trained = append(s.trained, t)
	s.mu.Unlock()
}
func (s *testSink) Event(kind, format string, _ ...any) {
	s.mu.Lock()
	s.events = append(s.events, kind+": "+format)
	s.mu.Unlock()
}

type harness struct {
	bus    *testBus
	chain  *testChain
	work   *testWindow
	sink   *testSink
	baseID cid.Cid
	base   *chain.Head

	roomMu sync.Mutex
	room   error // what Params.Room answers
}

func (h *harness) setRoom(err error) {
	h.roomMu.Lock()
	defer h.roomMu.Unlock()
	h.room = err
}

func (h *harness) roomErr() error {
	h.roomMu.Lock()
	defer h.roomMu.Unlock()
	return h.room
}

func newHarness(t *testing.T, rounds int) *harness {
	t.Helper()
	h := &harness{bus: &testBus{published: make(chan any, 16), subscribed: make(chan struct{}, 1)}, work: &testWindow{}, sink: &testSink{},
		chain: &testChain{stored: map[cid.Cid]*chain.Head{}, changed: make(chan struct{})}}
	h.base = &chain.Head{Experiment: "exp", Round: 4, Params: cids.Raw([]byte("params")).Bytes(),
		Ledger: lease.NewLedger("plan", 16)}
	h.baseID = h.chain.add(h.base)
	h.chain.set(h.baseID)
	tr := New(Params{Experiment: "exp", Seed: 7, InnerSteps: 50, Rounds: rounds, Self: self,
		IsValidator: func(p string) bool { return p == validator }, Bus: h.bus, Chain: h.chain, Work: h.work,
		Sink: h.sink, Log: slog.New(slog.DiscardHandler), Room: h.roomErr})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
	// Run subscribes before it reads; wait for that so no grant is delivered to nobody.
	select {
	case <-h.bus.subscribed:
	case <-time.After(5 * time.Second):
		t.Fatal("the trainer never subscribed")
	}
	return h
}

// grant is a valid lease of round base+1 for peer, as the validator issues it.
func (h *harness) grant(trainerPeer string, microshards []uint32, steps uint32, expiry time.Time) *gossip.Leases {
	l := lease.Lease{Round: h.base.Round + 1, Base: h.baseID.Bytes(), Trainer: trainerPeer, Microshards: microshards,
		Expiry: expiry.UnixMilli(), Issuer: validator, Epoch: h.base.Ledger.Epoch, Steps: steps}
	return &gossip.Leases{Experiment: "exp", Round: l.Round, Issuer: validator, Leases: []lease.Lease{l}, Attempt: 2}
}

func (h *harness) next(t *testing.T) any {
	t.Helper()
	select {
	case m := <-h.bus.published:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("the trainer published nothing")
		return nil
	}
}

// TestTrainerIgnoresLeasesNotForIt delivers a lease the trainer must not train, then a
// good one: the first thing published must be the good lease's contribution, trained once.
func TestTrainerIgnoresLeasesNotForIt(t *testing.T) {
	soon := time.Now().Add(time.Minute)
	cases := map[string]func(h *harness) (from string, m *gossip.Leases){
		"from a peer that is not a validator": func(h *harness) (string, *gossip.Leases) {
			m := h.grant(self, []uint32{1}, 0, soon)
			m.Issuer = "stranger"
			return "stranger", m
		},
		"issuer is not the sender": func(h *harness) (string, *gossip.Leases) {
			m := h.grant(self, []uint32{1}, 0, soon)
			m.Issuer = "validator-2"
			return validator, m
		},
		"for another trainer": func(h *harness) (string, *gossip.Leases) {
			return validator, h.grant("someone-else", []uint32{1}, 0, soon)
		},
		"expired": func(h *harness) (string, *gossip.Leases) {
			return validator, h.grant(self, []uint32{1}, 0, time.Now().Add(-time.Second))
		},
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, 0)
			from, m := bad(h)
			h.bus.Deliver(from, m)
			h.bus.Deliver(validator, h.grant(self, []uint32{3, 5}, 20, soon))
			c, ok := h.next(t).(*gossip.Contribution)
			require.True(t, ok, "a contribution")
			require.Equal(t, []uint32{3, 5}, c.Microshards)
			h.work.mu.Lock()
			defer h.work.mu.Unlock()
			require.Len(t, h.work.calls, 1)
		})
	}
}

func TestTrainerTrainsItsLease(t *testing.T) {
	cases := []struct {
		name      string
		steps     uint32
		wantSteps int
	}{
		{"steps named by the lease", 20, 20},
		{"no steps named: protocol.inner_steps", 0, 50},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			m := h.grant(self, []uint32{2, 9}, tc.steps, time.Now().Add(time.Minute))
			h.bus.Deliver(validator, m)
			c, ok := h.next(t).(*gossip.Contribution)
			require.True(t, ok, "a contribution")
			l := m.Leases[0]
			require.Equal(t, &gossip.Contribution{Experiment: "exp", Round: 5, Base: h.baseID.Bytes(), Lease: l.ID().Bytes(),
				Peer: self, Delta: cids.Raw([]byte{1}).Bytes(), Samples: 40, Loss: 1.5, Microshards: []uint32{2, 9},
				Seconds: 2, TrainSeconds: 1, FetchSeconds: c.FetchSeconds}, c)
			h.work.mu.Lock()
			require.Equal(t, []windowCall{{5, []uint32{2, 9}, tc.wantSteps, Seed(7, 5, 2, self)}}, h.work.calls)
			h.work.mu.Unlock()
			// The lease is let go when the window ends: after the contribution is published,
			// so the test may read the contribution first.
			require.Eventually(t, func() bool {
				h.sink.mu.Lock()
				defer h.sink.mu.Unlock()
				return len(h.sink.holding) == 2
			}, 10*time.Second, time.Millisecond, "the lease was not let go")
			h.sink.mu.Lock()
			defer h.sink.mu.Unlock()
			require.Equal(t, []Trained{{Round: 5, Delta: cids.Raw([]byte{1}), Samples: 40, Loss: 1.5, Seconds: 2, TrainSeconds: 1,
				OptState: "opt.pt"}}, h.sink.trained)
			require.Len(t, h.sink.holding, 2)
			require.Equal(t, l.ID(), h.sink.holding[0].Lease)
			require.Nil(t, h.sink.holding[1], "the lease is let go when the window ends")
		})
	}
}

// TestTrainerGivesBackWhatItCannotTrain: a lease that fails is released, naming why, and
// the failure is shown on the status page; a lease whose round is over already (a stale
// base, as a late joiner hears) is released without an event: nothing went wrong.
func TestTrainerGivesBackWhatItCannotTrain(t *testing.T) {
	cases := []struct {
		name   string
		setup  func(h *harness) *gossip.Leases
		reason string
		benign bool
	}{
		{"the worker fails", func(h *harness) *gossip.Leases {
			h.work.err = errors.New("worker crashed: exit status 1")
			return h.grant(self, []uint32{1}, 0, time.Now().Add(time.Minute))
		}, "worker crashed", false},
		{"the params cannot be fetched", func(h *harness) *gossip.Leases {
			h.bus.fetchErr = errors.New("no holder answered")
			return h.grant(self, []uint32{1}, 0, time.Now().Add(time.Minute))
		}, "no holder answered", false},
		{"a microshard already consumed", func(h *harness) *gossip.Leases {
			return h.grant(self, []uint32{16}, 0, time.Now().Add(time.Minute)) // the plan has 16
		}, "not available", false},
		{"the store is full", func(h *harness) *gossip.Leases {
			h.setRoom(errors.New("store /s: 0 B free, a lease needs 6 KiB"))
			return h.grant(self, []uint32{1}, 0, time.Now().Add(time.Minute))
		}, "cannot store what the lease of round 5 needs: store /s: 0 B free", false},
		// Its base head never arrives (the node could not store it): given back at once,
		// not after waiting baseWait for the head.
		{"the store is full, the base head not here", func(h *harness) *gossip.Leases {
			h.setRoom(errors.New("store /s: 0 B free"))
			m := h.grant(self, []uint32{1}, 0, time.Now().Add(time.Minute))
			m.Leases[0].Base = cids.Record([]byte("a head never stored")).Bytes()
			return m
		}, "0 B free", false},
		{"a stale base", func(h *harness) *gossip.Leases {
			m := h.grant(self, []uint32{1}, 0, time.Now().Add(time.Minute))
			newer := &chain.Head{Experiment: "exp", Round: 5, Parent: h.baseID.Bytes(), Ledger: h.base.Ledger}
			h.chain.set(h.chain.add(newer))
			return m
		}, "stale lease", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0)
			m := tc.setup(h)
			start := time.Now()
			h.bus.Deliver(validator, m)
			r, ok := h.next(t).(*gossip.Release)
			if h.roomErr() != nil {
				require.Less(t, time.Since(start), baseWait/2, "a full store's lease is given back at once")
				h.work.mu.Lock()
				require.Empty(t, h.work.calls, "nothing trained")
				h.work.mu.Unlock()
			}
			require.True(t, ok, "a release, not a contribution")
			require.Equal(t, m.Leases[0].ID().Bytes(), r.Lease)
			require.Equal(t, self, r.Peer)
			require.Contains(t, r.Reason, tc.reason)
			if tc.benign {
				// The lease loop takes the next lease only after this one's verdict: once
				// a second lease is released, the first left its event, if any.
				h.bus.Deliver(validator, h.grant(self, []uint32{2}, 1, time.Now().Add(time.Minute)))
				_, ok := h.next(t).(*gossip.Release)
				require.True(t, ok)
				h.sink.mu.Lock()
				defer h.sink.mu.Unlock()
				require.Empty(t, h.sink.events)
				return
			}
			require.Eventually(t, func() bool {
				h.sink.mu.Lock()
				defer h.sink.mu.Unlock()
				return len(h.sink.events) == 1
			}, 5*time.Second, time.Millisecond)
			require.Empty(t, h.sink.trained)
		})
	}
}

// TestTrainerStopsAtTheRoundLimit: at the experiment's last round the trainer trains no
// more leases.
func TestTrainerStopsAtTheRoundLimit(t *testing.T) {
	h := newHarness(t, 4) // the base head is round 4
	h.bus.Deliver(validator, h.grant(self, []uint32{1}, 0, time.Now().Add(time.Minute)))
	select {
	case m := <-h.bus.published:
		t.Fatalf("published %T after the last round", m)
	case <-time.After(200 * time.Millisecond):
	}
	h.work.mu.Lock()
	defer h.work.mu.Unlock()
	require.Empty(t, h.work.calls)
}

func TestSeedDiffersByRoundAttemptAndPeer(t *testing.T) {
	base := Seed(1, 2, 3, "p")
	require.Equal(t, base, Seed(1, 2, 3, "p"))
	require.GreaterOrEqual(t, base, int64(0))
	for _, other := range []int64{Seed(2, 2, 3, "p"), Seed(1, 3, 3, "p"), Seed(1, 2, 4, "p"), Seed(1, 2, 3, "q")} {
		require.NotEqual(t, base, other)
	}
}
