package headsync

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/progress"
)

type signer struct {
	key crypto.PrivKey
	id  peer.ID
}

func newSigner(t *testing.T) signer {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	id, err := peer.IDFromPrivateKey(k)
	require.NoError(t, err)
	return signer{k, id}
}

func head(round uint64, parent cid.Cid) *chain.Head {
	h := &chain.Head{Version: 1, Network: "net", Experiment: "exp", Round: round,
		Params:     cids.Record([]byte{byte(round), 'p'}).Bytes(),
		LayoutHash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		Ledger:     chain.Ledger{Plan: "plan", Shards: 8, Consumed: make([]byte, 1)}}
	if parent.Defined() {
		h.Parent = parent.Bytes()
	}
	return h
}

// signed is h with the signatures of by.
func signed(t *testing.T, h *chain.Head, by ...signer) *chain.SignedHead {
	t.Helper()
	b, err := h.Encode()
	require.NoError(t, err)
	id, err := h.ID()
	require.NoError(t, err)
	sh := &chain.SignedHead{Head: b}
	for _, s := range by {
		sig, err := chain.Sign(s.key, id)
		require.NoError(t, err)
		sh.Add(sig)
	}
	return sh
}

type testBus struct {
	bus.Fanout
	published  chan any
	subscribed chan struct{}
}

func (b *testBus) Publish(_ context.Context, msg any) error { b.published <- msg; return nil }
func (b *testBus) Fetch(context.Context, cid.Cid, ...peer.ID) error {
	return errors.New("head sync fetches through FetchArtifacts")
}
func (b *testBus) FetchAtMost(ctx context.Context, id cid.Cid, _ uint64, hints ...peer.ID) error {
	return b.Fetch(ctx, id, hints...)
}
func (b *testBus) Subscribe() *bus.Inbox {
	in := b.Fanout.Subscribe()
	b.subscribed <- struct{}{}
	return in
}

// testPeers serves one chain, the same whichever peer is asked: its tip and every head it
// holds. It records who was asked for a tip.
type testPeers struct {
	mu          sync.Mutex
	connected   peer.ID          // asked at start
	unreachable map[peer.ID]bool // no connection held to these
	tip         *chain.SignedHead
	heads       map[cid.Cid]*chain.SignedHead
	notes       map[cid.Cid]*chain.Notes // served with the heads
	askedTip    []peer.ID
	askedHead   []cid.Cid
}

func (p *testPeers) Connected() []peer.ID { return []peer.ID{p.connected} }

func (p *testPeers) Reachable(who peer.ID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.unreachable[who]
}

// timesAsked is how many times a tip was asked for.
func (p *testPeers) timesAsked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.askedTip)
}

func (p *testPeers) fetched(sh *chain.SignedHead) (*chain.Fetched, error) {
	h, err := sh.Decode()
	if err != nil {
		return nil, err
	}
	return &chain.Fetched{Signed: sh, Head: h, Notes: p.notes[sh.ID()]}, nil
}

func (p *testPeers) RequestTip(_ context.Context, who peer.ID) (*chain.Fetched, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.askedTip = append(p.askedTip, who)
	if p.tip == nil {
		return nil, chain.ErrNotFound
	}
	return p.fetched(p.tip)
}

func (p *testPeers) RequestHead(_ context.Context, who peer.ID, id cid.Cid) (*chain.Fetched, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.askedHead = append(p.askedHead, id)
	sh, ok := p.heads[id]
	if !ok {
		return nil, chain.ErrNotFound
	}
	return p.fetched(sh)
}

type harness struct {
	v1, v2, stranger signer
	bus              *testBus
	tips             *chain.Tips
	heads            *chain.Store
	peers            *testPeers
	fetchedArtifacts chan uint64             // rounds whose artifacts were fetched
	fetchFails       func(*chain.Head) error // when set, decides whether fetching a head's artifacts fails (under peers.mu)
	hints            map[uint64][]peer.ID    // the holders asked for each round's artifacts (under peers.mu)
	work             *progress.Recorder      // the progress shown
	genesis          *chain.SignedHead
	genesisID        cid.Cid
}

// newHarness runs head sync for a node that is validator v1 (when selfIsValidator) of two,
// v1 and v2, with quorum 2, holding genesis signed by both.
func newHarness(t *testing.T, selfIsValidator bool) *harness {
	t.Helper()
	h := &harness{v1: newSigner(t), v2: newSigner(t), stranger: newSigner(t),
		bus: &testBus{published: make(chan any, 16), subscribed: make(chan struct{}, 1)}, fetchedArtifacts: make(chan uint64, 16), work: &progress.Recorder{},
		hints: map[uint64][]peer.ID{}}
	var err error
	h.heads, err = chain.OpenStore(filepath.Join(t.TempDir(), "heads"))
	require.NoError(t, err)
	vals := []string{h.v1.id.String(), h.v2.id.String()}
	h.tips = chain.NewTips(h.heads, vals, 2)
	h.genesis = signed(t, head(0, cid.Undef), h.v1, h.v2)
	h.genesisID = h.genesis.ID()
	ok, err := h.tips.Offer(h.genesis)
	require.NoError(t, err)
	require.True(t, ok)
	h.peers = &testPeers{connected: h.v2.id, heads: map[cid.Cid]*chain.SignedHead{}, notes: map[cid.Cid]*chain.Notes{}}
	self := h.stranger.id.String()
	if selfIsValidator {
		self = h.v1.id.String()
	}
	s := New(Params{Experiment: "exp", Self: self, IsValidator: func(p string) bool { return p == vals[0] || p == vals[1] },
		Bus: h.bus, Tips: h.tips, Heads: h.heads, Peers: h.peers,
		FetchArtifacts: func(_ context.Context, hd *chain.Head, hints ...peer.ID) error {
			h.peers.mu.Lock()
			h.hints[hd.Round] = hints
			var err error
			if h.fetchFails != nil {
				err = h.fetchFails(hd)
			}
			h.peers.mu.Unlock()
			if err != nil {
				return err
			}
			h.fetchedArtifacts <- hd.Round
			return nil
		},
		Progress: h.work, Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})
	select {
	case <-h.bus.subscribed:
	case <-time.After(5 * time.Second):
		t.Fatal("head sync never subscribed")
	}
	return h
}

func (h *harness) waitRound(t *testing.T, round uint64) cid.Cid {
	t.Helper()
	require.Eventually(t, func() bool {
		_, cur := h.tips.Current()
		return cur.Round == round
	}, 5*time.Second, time.Millisecond, "the canonical head never reached round %d", round)
	id, _ := h.tips.Current()
	return id
}

func TestHeadWithQuorumBecomesCanonical(t *testing.T) {
	h := newHarness(t, false)
	r1 := signed(t, head(1, h.genesisID), h.v1, h.v2)
	h.bus.Deliver(h.v2.id.String(), &gossip.Head{Experiment: "exp", Signed: *r1})
	require.Equal(t, r1.ID(), h.waitRound(t, 1))
	require.Equal(t, uint64(1), <-h.fetchedArtifacts, "the head's artifacts are fetched before it becomes canonical")
}

// A head's artifacts are asked of the peer it came from and then of every validator whose
// signature on it verifies (they made or recomputed them): a node that cannot reach the
// proposer gets them from the validators that attested. Signatures that do not verify,
// a stranger's, and this node's own are no holders; by catch-up the same.
func TestArtifactsAskedOfTheValidatorsThatSigned(t *testing.T) {
	for _, self := range []bool{false, true} {
		t.Run(fmt.Sprintf("self is validator %v", self), func(t *testing.T) {
			h := newHarness(t, self)
			// A signature in v2's name made with another key names no holder.
			r0 := head(1, h.genesisID)
			r0.Params = cids.Record([]byte("forged")).Bytes()
			id0, err := r0.ID()
			require.NoError(t, err)
			forged, err := chain.Sign(h.stranger.key, id0)
			require.NoError(t, err)
			forged.Peer = h.v2.id.String()
			require.Equal(t, []peer.ID{h.v1.id}, (&Sync{Params: Params{IsValidator: func(string) bool { return true }}}).holders(h.v1.id, id0, []chain.Signature{forged}),
				"a signature that does not verify names no holder")
			r1 := signed(t, head(1, h.genesisID), h.v1, h.v2, h.stranger)
			h.bus.Deliver(h.v2.id.String(), &gossip.Head{Experiment: "exp", Signed: *r1})
			require.Equal(t, r1.ID(), h.waitRound(t, 1))
			want := []peer.ID{h.v2.id, h.v1.id}
			if self {
				want = []peer.ID{h.v2.id} // this node's own signature names no holder
			}
			h.peers.mu.Lock()
			require.Equal(t, want, h.hints[1], "the sender, then the other validators that signed; never a stranger")
			h.peers.mu.Unlock()

			// By catch-up from a peer that is no validator (a trainer ahead): that peer,
			// then the validators that signed.
			r2 := signed(t, head(2, r1.ID()), h.v1, h.v2)
			h.peers.mu.Lock()
			h.peers.heads[r2.ID()], h.peers.tip = r2, r2
			h.peers.mu.Unlock()
			trainer := newSigner(t)
			h.bus.Deliver(trainer.id.String(), &gossip.Announce{Experiment: "exp", Peer: trainer.id.String(), Round: 2, Head: r2.ID().Bytes()})
			require.Equal(t, r2.ID(), h.waitRound(t, 2))
			want = []peer.ID{trainer.id, h.v1.id, h.v2.id}
			if self {
				want = []peer.ID{trainer.id, h.v2.id}
			}
			if h.v2.id.String() < h.v1.id.String() { // a signed head's signatures are sorted by peer
				want[1], want[len(want)-1] = want[len(want)-1], want[1]
			}
			h.peers.mu.Lock()
			require.Equal(t, want, h.hints[2])
			h.peers.mu.Unlock()
		})
	}
}

// TestHeadsThatMustNotCount: a head from a peer that is not a validator, and one without
// quorum, leave the canonical head where it is; the head that follows them is taken.
func TestHeadsThatMustNotCount(t *testing.T) {
	cases := map[string]func(h *harness) (string, *chain.SignedHead){
		"published by a stranger": func(h *harness) (string, *chain.SignedHead) {
			return h.stranger.id.String(), signed(t, head(1, h.genesisID), h.v1, h.v2)
		},
		"one signature of two": func(h *harness) (string, *chain.SignedHead) {
			return h.v2.id.String(), signed(t, head(1, h.genesisID), h.v2)
		},
		"signed by a stranger as well": func(h *harness) (string, *chain.SignedHead) {
			return h.v2.id.String(), signed(t, head(1, h.genesisID), h.v2, h.stranger)
		},
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, false)
			from, sh := bad(h)
			h.bus.Deliver(from, &gossip.Head{Experiment: "exp", Signed: *sh})
			// A good head of another round 1 comes next; it must be the one taken.
			good := head(1, h.genesisID)
			good.Params = cids.Record([]byte("other params")).Bytes()
			gs := signed(t, good, h.v1, h.v2)
			h.bus.Deliver(h.v1.id.String(), &gossip.Head{Experiment: "exp", Signed: *gs})
			require.Equal(t, gs.ID(), h.waitRound(t, 1))
		})
	}
}

// TestAttestationBeforeItsHead: the second signature arrives before the head it signs;
// it waits, and the head reaches its quorum when it arrives with the first.
func TestAttestationBeforeItsHead(t *testing.T) {
	h := newHarness(t, false)
	r1 := head(1, h.genesisID)
	id, err := r1.ID()
	require.NoError(t, err)
	sig, err := chain.Sign(h.v1.key, id)
	require.NoError(t, err)
	h.bus.Deliver(h.v1.id.String(), &gossip.Attestation{Experiment: "exp", Head: id.Bytes(), Round: 1, Sig: sig})
	// A forged attestation (v2's signature claimed to be from v1) is dropped.
	forged, err := chain.Sign(h.v2.key, id)
	require.NoError(t, err)
	h.bus.Deliver(h.v1.id.String(), &gossip.Attestation{Experiment: "exp", Head: id.Bytes(), Round: 1, Sig: forged})
	h.bus.Deliver(h.v2.id.String(), &gossip.Head{Experiment: "exp", Signed: *signed(t, r1, h.v2)})
	require.Equal(t, id, h.waitRound(t, 1))
}

// TestCatchUpFromAPeerAhead: at start the connected peer is asked for its tip (it has
// none yet); then a peer announcing round 3 is asked for its tip, the heads between are
// fetched from it and stored, and the tip becomes canonical.
func TestCatchUpFromAPeerAhead(t *testing.T) {
	h := newHarness(t, false)
	require.Eventually(t, func() bool { return h.peers.timesAsked() == 1 }, 5*time.Second, time.Millisecond, "the connected peer is asked at start")
	parent := h.genesisID
	var tip *chain.SignedHead
	for r := uint64(1); r <= 3; r++ {
		tip = signed(t, head(r, parent), h.v1, h.v2)
		h.peers.mu.Lock()
		h.peers.heads[tip.ID()] = tip
		h.peers.mu.Unlock()
		parent = tip.ID()
	}
	h.peers.mu.Lock()
	h.peers.tip = tip
	h.peers.mu.Unlock()
	h.bus.Deliver(h.v1.id.String(), &gossip.Announce{Experiment: "exp", Peer: h.v1.id.String(), Round: 3, Head: tip.ID().Bytes()})
	require.Equal(t, tip.ID(), h.waitRound(t, 3))
	h.peers.mu.Lock()
	require.Equal(t, []peer.ID{h.v2.id, h.v1.id}, h.peers.askedTip)
	h.peers.mu.Unlock()
	for r := uint64(1); r < 3; r++ {
		require.True(t, h.heads.Has(mustParent(t, h.heads, tip.ID(), 3-r)), "ancestor %d stored", r)
	}
	// The two heads between genesis and the tip were shown as fetched.
	require.Equal(t, []progress.Recorded{{Name: "catching up on the chain to round 3", Unit: "heads", Total: 2, Done: 2, Finished: true}}, h.work.Tasks())
}

// TestNoCatchUpFromAPeerWithoutAConnection: an announcement ahead from a peer this node
// holds no connection to (gossip brings announcements from anyone; a dial to a peer behind
// NAT would hang the loop for the request's timeout) asks nothing; the same announcement
// from a connected peer is caught up from.
func TestNoCatchUpFromAPeerWithoutAConnection(t *testing.T) {
	h := newHarness(t, false)
	require.Eventually(t, func() bool { return h.peers.timesAsked() == 1 }, 5*time.Second, time.Millisecond, "the connected peer is asked at start")
	tip := signed(t, head(1, h.genesisID), h.v1, h.v2)
	h.peers.mu.Lock()
	h.peers.heads[tip.ID()] = tip
	h.peers.tip = tip
	h.peers.unreachable = map[peer.ID]bool{h.stranger.id: true}
	h.peers.mu.Unlock()
	h.bus.Deliver(h.stranger.id.String(), &gossip.Announce{Experiment: "exp", Peer: h.stranger.id.String(), Round: 1, Head: tip.ID().Bytes()})
	h.bus.Deliver(h.v1.id.String(), &gossip.Announce{Experiment: "exp", Peer: h.v1.id.String(), Round: 1, Head: tip.ID().Bytes()})
	require.Equal(t, tip.ID(), h.waitRound(t, 1))
	h.peers.mu.Lock()
	defer h.peers.mu.Unlock()
	require.Equal(t, []peer.ID{h.v2.id, h.v1.id}, h.peers.askedTip, "the peer without a connection is not asked")
}

// TestCatchUpMovesOnToANewerTip: while a catch-up downloads its tip's artifacts the peer
// closes another round and prunes them (a validator keeps its tip's outer state alone), so
// the download fails; the catch-up asks the peer again at once and takes the newer tip,
// without another announcement. A tip that fails and stays the peer's tip is asked for a
// bounded number of times.
func TestCatchUpMovesOnToANewerTip(t *testing.T) {
	for _, tc := range []struct {
		name      string
		moves     bool // the peer closes round 3 while round 2's artifacts download
		wantRound uint64
	}{
		{"the tip moves on", true, 3},
		{"the tip stays", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, false)
			require.Eventually(t, func() bool { return h.peers.timesAsked() == 1 }, 5*time.Second, time.Millisecond, "the connected peer is asked at start")
			h1 := signed(t, head(1, h.genesisID), h.v1, h.v2)
			h2 := signed(t, head(2, h1.ID()), h.v1, h.v2)
			h3 := signed(t, head(3, h2.ID()), h.v1, h.v2)
			h.peers.mu.Lock()
			for _, sh := range []*chain.SignedHead{h1, h2} {
				h.peers.heads[sh.ID()] = sh
			}
			h.peers.tip = h2
			h.fetchFails = func(hd *chain.Head) error { // called under peers.mu
				if hd.Round != 2 {
					return nil
				}
				if tc.moves {
					h.peers.heads[h3.ID()] = h3
					h.peers.tip = h3
				}
				return errors.New("no peer holds the artifact")
			}
			h.peers.mu.Unlock()
			h.bus.Deliver(h.v1.id.String(), &gossip.Announce{Experiment: "exp", Peer: h.v1.id.String(), Round: 2, Head: h2.ID().Bytes()})
			if tc.moves {
				require.Equal(t, h3.ID(), h.waitRound(t, 3))
				require.Equal(t, 3, h.peers.timesAsked(), "asked at start, for round 2, then again for round 3")
				return
			}
			require.Eventually(t, func() bool { return h.peers.timesAsked() == 3 }, 5*time.Second, time.Millisecond)
			time.Sleep(100 * time.Millisecond) // nothing more should come
			require.Equal(t, 3, h.peers.timesAsked(), "asked at start, for round 2, and once more: the same tip is not fetched again")
			_, cur := h.tips.Current()
			require.Equal(t, tc.wantRound, cur.Round)
		})
	}
}

// mustParent walks up n parents from id.
func mustParent(t *testing.T, s *chain.Store, id cid.Cid, n uint64) cid.Cid {
	t.Helper()
	for range n {
		_, h, err := s.Get(id)
		require.NoError(t, err)
		id, err = h.ParentID()
		require.NoError(t, err)
	}
	return id
}

// TestAttestationSentAgain: a validator re-publishing a head this validator signed, without
// this validator's signature, has missed the attestation; it is sent again, once per
// re-publication.
func TestAttestationSentAgain(t *testing.T) {
	h := newHarness(t, true) // this node is v1
	r1 := head(1, h.genesisID)
	both := signed(t, r1, h.v1, h.v2)
	ok, err := h.tips.Offer(both)
	require.NoError(t, err)
	require.True(t, ok)
	h.bus.Deliver(h.v2.id.String(), &gossip.Head{Experiment: "exp", Signed: *signed(t, r1, h.v2)})
	select {
	case m := <-h.bus.published:
		a, ok := m.(*gossip.Attestation)
		require.True(t, ok, "an attestation, got %T", m)
		require.Equal(t, both.ID().Bytes(), a.Head)
		require.Equal(t, h.v1.id.String(), a.Sig.Peer)
		require.NoError(t, chain.VerifySignature(both.ID(), a.Sig))
	case <-time.After(5 * time.Second):
		t.Fatal("the attestation was not sent again")
	}
	// With this validator's signature on it, the sender has it: nothing is sent.
	h.bus.Deliver(h.v2.id.String(), &gossip.Head{Experiment: "exp", Signed: *both})
	select {
	case m := <-h.bus.published:
		t.Fatalf("published %T for a head that carries our signature", m)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestEarlierNotesComplete: round 1's head arrives with notes that lack held-out metrics
// (its leader evaluates it after publishing it); round 2's head carries round 1's
// completed notes, and they are kept before round 2's head is canonical, when they are
// its leader's. Notes signed by anyone else leave the bare ones.
func TestEarlierNotesComplete(t *testing.T) {
	cases := []struct {
		name     string
		signer   func(h *harness) signer
		complete bool
	}{
		{"by the same leader", func(h *harness) signer { return h.v1 }, true},
		{"by another validator", func(h *harness) signer { return h.v2 }, false},
		{"by a stranger", func(h *harness) signer { return h.stranger }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, false)
			r1 := signed(t, head(1, h.genesisID), h.v1, h.v2)
			bare := &chain.Notes{Round: 1, Seconds: 2, HeldOutDue: true}
			require.NoError(t, chain.SignNotes(h.v1.key, r1.ID(), bare))
			h.bus.Deliver(h.v1.id.String(), &gossip.Head{Experiment: "exp", Signed: *r1, Notes: bare})
			h.waitRound(t, 1)
			require.Nil(t, h.tips.Notes(r1.ID()).HeldOut)

			done := chain.Notes{Round: 1, Seconds: 2, HeldOut: map[string]float64{"loss": 1.5}}
			require.NoError(t, chain.SignNotes(tc.signer(h).key, r1.ID(), &done))
			r2 := signed(t, head(2, r1.ID()), h.v1, h.v2)
			unknown := chain.Notes{Round: 1, HeldOut: map[string]float64{"loss": 9}}
			require.NoError(t, chain.SignNotes(h.v1.key, h.genesisID, &unknown)) // for the wrong round: dropped
			h.bus.Deliver(h.v1.id.String(), &gossip.Head{Experiment: "exp", Signed: *r2,
				Earlier: []gossip.EarlierNotes{{Head: r1.ID().Bytes(), Notes: done}, {Head: h.genesisID.Bytes(), Notes: unknown}}})
			h.waitRound(t, 2)
			got := h.tips.Notes(r1.ID())
			if tc.complete {
				require.Equal(t, map[string]float64{"loss": 1.5}, got.HeldOut, "kept before round 2 was canonical")
				stored, err := h.heads.Notes(r1.ID())
				require.NoError(t, err)
				require.Equal(t, got, stored)
			} else {
				require.Nil(t, got.HeldOut)
			}
			require.Nil(t, h.tips.Notes(h.genesisID))
		})
	}
}

// TestCatchUpCompletesTheNotesOfHeadsHeld: a node holds round 1's head with notes whose
// held-out metrics are due (it stopped before its leader's evaluation ended) and catches up
// from a peer, to round 4 (heads fetched between) or to round 2 (none). It asks the peer
// again for round 1's notes, which carry the metrics there, and takes the later rounds'
// notes with their heads; genesis, whose notes are complete here, is not asked for.
func TestCatchUpCompletesTheNotesOfHeadsHeld(t *testing.T) {
	for _, tip := range []uint64{4, 2} {
		t.Run(fmt.Sprintf("to round %d", tip), func(t *testing.T) { catchUpCompletes(t, tip) })
	}
}

func catchUpCompletes(t *testing.T, to uint64) {
	h := newHarness(t, false)
	notes := func(id cid.Cid, round uint64, held map[string]float64) *chain.Notes {
		n := &chain.Notes{Round: round, Seconds: 1, HeldOut: held, HeldOutDue: held == nil}
		require.NoError(t, chain.SignNotes(h.v1.key, id, n))
		return n
	}
	require.NoError(t, h.tips.SetNotes(h.genesisID, 0, notes(h.genesisID, 0, map[string]float64{"loss": 3})))
	r1 := signed(t, head(1, h.genesisID), h.v1, h.v2)
	require.NoError(t, h.tips.SetNotes(r1.ID(), 1, notes(r1.ID(), 1, nil)))
	ok, err := h.tips.Offer(r1)
	require.NoError(t, err)
	require.True(t, ok)

	h.peers.mu.Lock()
	h.peers.heads[r1.ID()] = r1
	h.peers.notes[r1.ID()] = notes(r1.ID(), 1, map[string]float64{"loss": 2})
	parent := r1.ID()
	var tip *chain.SignedHead
	for r := uint64(2); r <= to; r++ {
		tip = signed(t, head(r, parent), h.v1, h.v2)
		h.peers.heads[tip.ID()] = tip
		h.peers.notes[tip.ID()] = notes(tip.ID(), r, map[string]float64{"loss": 1 / float64(r)})
		parent = tip.ID()
	}
	h.peers.tip = tip
	h.peers.mu.Unlock()
	h.bus.Deliver(h.v1.id.String(), &gossip.Announce{Experiment: "exp", Peer: h.v1.id.String(), Round: to, Head: tip.ID().Bytes()})
	h.waitRound(t, to)
	require.Equal(t, map[string]float64{"loss": 2}, h.tips.Notes(r1.ID()).HeldOut, "round 1's notes completed")
	for r := uint64(2); r <= to; r++ {
		id := mustParent(t, h.heads, tip.ID(), to-r)
		require.Equal(t, 1/float64(r), h.tips.Notes(id).HeldOut["loss"], "round %d", r)
	}
	h.peers.mu.Lock()
	defer h.peers.mu.Unlock()
	require.Contains(t, h.peers.askedHead, r1.ID())
	require.NotContains(t, h.peers.askedHead, h.genesisID)
}

// A head that cannot be fetched once a head of its round or later is canonical here (a
// late joiner's catch-up overtaken by gossip, a peer that pruned the parameters meanwhile)
// is logged at debug; one the node still lacks is a warning.
func TestFailureOnASupersededHeadIsNotAWarning(t *testing.T) {
	h := newHarness(t, false) // genesis (round 0) is canonical
	var logs bytes.Buffer
	s := New(Params{Tips: h.tips, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	cause := errors.New("no holder has the parameters")
	require.ErrorIs(t, s.supersededErr(0, cause), errSuperseded)
	require.Equal(t, cause, s.supersededErr(1, cause))

	s.catchUpFailed(context.Background(), h.v2.id, 0, cause)
	require.Empty(t, logs.String(), "round 0 is canonical already: debug")
	s.catchUpFailed(context.Background(), h.v2.id, 1, cause)
	require.Contains(t, logs.String(), `level=WARN msg="catch-up failed"`)
}
