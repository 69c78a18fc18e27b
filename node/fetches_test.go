package node

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// gatedBus is a bus whose fetches each wait for the test to open their gate.
type gatedBus struct {
	bus.Fanout
	started chan cid.Cid
	gates   map[cid.Cid]chan error
	mu      sync.Mutex
	hints   map[cid.Cid][]peer.ID
}

func (b *gatedBus) Publish(context.Context, any) error { return nil }

func (b *gatedBus) Fetch(ctx context.Context, id cid.Cid, hints ...peer.ID) error {
	b.mu.Lock()
	if b.hints == nil {
		b.hints = map[cid.Cid][]peer.ID{}
	}
	b.hints[id] = hints
	b.mu.Unlock()
	b.started <- id
	select {
	case err := <-b.gates[id]:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestLeaderFetchesUpdatesSideBySide: the round's leader starts fetching every accepted
// contribution's update at once, without waiting for the one before (with the fetch
// inside its loop, trainers on slow uplinks uploaded one after another); each trainer
// reports as its own update arrives, in whatever order; a failed fetch is rejected and
// struck, and an update still on its way at the deadline keeps its lease and counts.
func TestLeaderFetchesUpdatesSideBySide(t *testing.T) {
	const round = 4
	base := cids.Record([]byte("base of round 4"))
	v, r := leadingValidator(t, "A", []string{"A"}, round, base, &chain.Head{Round: round - 1})
	store, err := artifact.OpenStore(filepath.Join(t.TempDir(), "artifacts"), artifact.Options{})
	require.NoError(t, err)
	gb := &gatedBus{started: make(chan cid.Cid, 8), gates: map[cid.Cid]chan error{}}
	v.bus, v.store = gb, store
	r.deadline = time.Now().Add(time.Hour)

	trainers := []string{"t1", "t2", "t3", "t4"}
	var leases []lease.Lease
	deltas := map[string]cid.Cid{}
	for i, p := range trainers {
		l := lease.Lease{Round: round, Base: base.Bytes(), Trainer: p, Microshards: []uint32{uint32(i)}, Issuer: "A", Expiry: 1}
		leases = append(leases, l)
		r.leases[l.ID()] = l
		deltas[p], err = store.PutBytes(fmt.Appendf(nil, "update of %s", p))
		require.NoError(t, err)
		gb.gates[deltas[p]] = make(chan error, 1)
	}
	r.book.Grant(leases)
	for _, l := range leases {
		v.accept(r, l.Trainer, &gossip.Contribution{Round: round, Base: base.Bytes(), Lease: l.ID().Bytes(), Peer: l.Trainer,
			Delta: deltas[l.Trainer].Bytes(), Microshards: l.Microshards, Samples: 8, Seconds: 2})
	}
	// Every fetch is under way before any has finished, and accept returned for each.
	started := map[cid.Cid]bool{}
	for range trainers {
		select {
		case id := <-gb.started:
			started[id] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d fetches started", len(started), len(trainers))
		}
	}
	require.Len(t, started, len(trainers))
	require.Empty(t, r.received, "nothing counts before its update is here")
	require.False(t, r.book.Settled(), "the round waits for the updates on their way")

	// A second announcement of t1 while its update is on its way is a replay, not a second
	// fetch.
	v.accept(r, "t1", &gossip.Contribution{Round: round, Base: base.Bytes(), Lease: leases[0].ID().Bytes(), Peer: "t1",
		Delta: deltas["t1"].Bytes(), Microshards: leases[0].Microshards})
	require.Equal(t, map[string]uint64{"replay": 1}, rejections(v))

	finish := func(p string, err error) {
		t.Helper()
		gb.gates[deltas[p]] <- err
		select {
		case res := <-r.fetches.done:
			require.Equal(t, p, res.from)
			v.fetchedDelta(r, res)
		case <-time.After(10 * time.Second):
			t.Fatalf("the fetch of %s did not report back", p)
		}
	}
	finish("t3", nil) // the last one announced arrives first
	require.Equal(t, []string{"t3"}, receivedPeers(r))
	finish("t1", nil)
	require.Equal(t, []string{"t1", "t3"}, receivedPeers(r))
	finish("t2", errors.New("holder went away"))
	require.Equal(t, map[string]uint64{"replay": 1, "unavailable": 1}, rejections(v))
	require.True(t, v.quarantine.Quarantined("t2", round+1), "an update that cannot be fetched is the trainer's fault")

	// At the deadline t4's update is still on its way: announced in time, it keeps its
	// lease (the deadline expires only leases with nothing announced), and counts when it
	// arrives.
	v.expire(r)
	require.False(t, r.book.Settled(), "the round waits for t4's update")
	require.Empty(t, r.book.Barred()["t4"])
	finish("t4", nil)
	require.Equal(t, []string{"t1", "t3", "t4"}, receivedPeers(r))
	require.True(t, r.book.Settled())
	require.Equal(t, map[string]uint64{"replay": 1, "unavailable": 1}, rejections(v), "no late rejection")
}

// TestUpdateArrivingAfterItsLeaseEnded: an update whose trainer gave its lease back while
// it was on its way is not counted; one whose transfer fails after the deadline is late,
// without a strike.
func TestUpdateArrivingAfterItsLeaseEnded(t *testing.T) {
	const round = 4
	base := cids.Record([]byte("base of round 4"))
	v, r := leadingValidator(t, "A", []string{"A"}, round, base, &chain.Head{Round: round - 1})
	store, err := artifact.OpenStore(filepath.Join(t.TempDir(), "artifacts"), artifact.Options{})
	require.NoError(t, err)
	gb := &gatedBus{started: make(chan cid.Cid, 8), gates: map[cid.Cid]chan error{}}
	v.bus, v.store = gb, store
	r.deadline = time.Now().Add(time.Hour)
	var leases []lease.Lease
	deltas := map[string]cid.Cid{}
	for i, p := range []string{"t1", "t2"} {
		l := lease.Lease{Round: round, Base: base.Bytes(), Trainer: p, Microshards: []uint32{uint32(i)}, Issuer: "A", Expiry: 1}
		leases = append(leases, l)
		r.leases[l.ID()] = l
		deltas[p], err = store.PutBytes(fmt.Appendf(nil, "update of %s", p))
		require.NoError(t, err)
		gb.gates[deltas[p]] = make(chan error, 1)
	}
	r.book.Grant(leases)
	for _, l := range leases {
		v.accept(r, l.Trainer, &gossip.Contribution{Round: round, Base: base.Bytes(), Lease: l.ID().Bytes(), Peer: l.Trainer,
			Delta: deltas[l.Trainer].Bytes(), Microshards: l.Microshards, Samples: 8})
		<-gb.started
	}
	v.release(r, "t1", &gossip.Release{Round: round, Base: base.Bytes(), Lease: leases[0].ID().Bytes(), Peer: "t1", Reason: "worker restarted"})
	r.deadline = time.Now().Add(-time.Second) // the attempt's deadline has passed
	v.expire(r)
	require.Empty(t, r.book.Barred()["t2"], "t2's update is arriving")
	for _, p := range []string{"t1", "t2"} {
		err := error(nil)
		if p == "t2" {
			err = errors.New("stream reset")
		}
		gb.gates[deltas[p]] <- err
		v.fetchedDelta(r, <-r.fetches.done)
	}
	require.Empty(t, r.received, "t1 gave its lease back; t2's update never came")
	require.Equal(t, map[string]uint64{"late": 1}, rejections(v))
	require.Equal(t, "late", r.book.Barred()["t2"])
	require.False(t, v.quarantine.Quarantined("t2", round+1), "a transfer lost after the deadline is no strike")
	require.True(t, r.book.Settled())
}

func mustPeer(t *testing.T, s string) peer.ID {
	t.Helper()
	id, err := peer.Decode(s)
	require.NoError(t, err)
	return id
}

func receivedPeers(r *openRound) []string {
	var out []string
	for _, p := range []string{"t1", "t2", "t3", "t4"} {
		if _, ok := r.received[p]; ok {
			out = append(out, p)
		}
	}
	return out
}

// TestVerifierFetchesUpdatesSideBySideFromTheProposer: a validator verifying a proposal
// fetches its updates at once, not one after another, asking the proposer (which holds
// every update it merged) before each trainer, whose home uplink would otherwise carry its
// update once per validator. A fetch that fails fails the verification, naming the update.
func TestVerifierFetchesUpdatesSideBySideFromTheProposer(t *testing.T) {
	const round = 4
	base := cids.Record([]byte("base of round 4"))
	ids := map[string]peer.ID{}
	for _, name := range []string{"proposer", "t1", "t2", "t3"} {
		_, id := pinKey(t, name)
		ids[name] = mustPeer(t, id)
	}
	v, _ := leadingValidator(t, "A", []string{"A", ids["proposer"].String()}, round, base, &chain.Head{Round: round - 1})
	heads, err := chain.OpenStore(filepath.Join(t.TempDir(), "heads"))
	require.NoError(t, err)
	gb := &gatedBus{started: make(chan cid.Cid, 8), gates: map[cid.Cid]chan error{}}
	v.bus, v.heads = gb, heads
	prop := &gossip.Proposal{}
	for i, name := range []string{"t1", "t2", "t3"} {
		l := lease.Lease{Round: round, Base: base.Bytes(), Trainer: ids[name].String(), Microshards: []uint32{uint32(i)},
			Issuer: ids["proposer"].String(), Expiry: 1}
		delta := cids.Record(fmt.Appendf(nil, "update of %s", name))
		gb.gates[delta] = make(chan error, 1)
		prop.Leases = append(prop.Leases, l)
		prop.Candidates = append(prop.Candidates, gossip.Candidate{Peer: l.Trainer, Delta: delta.Bytes(), Lease: l.ID().Bytes(),
			Samples: 8, Microshards: l.Microshards})
	}
	done := make(chan error, 1)
	go func() {
		done <- v.verifyProposal(t.Context(), ids["proposer"].String(), base, &chain.Head{Round: round - 1},
			&gossip.Head{Proposal: prop}, cids.Record([]byte("proposed head")))
	}()
	for range prop.Candidates {
		select {
		case <-gb.started:
		case <-time.After(10 * time.Second):
			t.Fatal("the fetches did not all start before any finished")
		}
	}
	gb.mu.Lock()
	for _, c := range prop.Candidates {
		delta, err := cid.Cast(c.Delta)
		require.NoError(t, err)
		trainer, err := peer.Decode(c.Peer)
		require.NoError(t, err)
		require.Equal(t, []peer.ID{ids["proposer"], trainer}, gb.hints[delta], "the proposer first, then the trainer")
	}
	gb.mu.Unlock()
	for _, c := range prop.Candidates {
		delta, _ := cid.Cast(c.Delta)
		gb.gates[delta] <- errors.New("holder went away")
	}
	select {
	case err := <-done:
		require.ErrorContains(t, err, "fetch delta")
		require.ErrorContains(t, err, "holder went away")
	case <-time.After(10 * time.Second):
		t.Fatal("verification did not end")
	}
}
