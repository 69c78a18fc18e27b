package validator

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
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/testenv"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
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

func (b *gatedBus) FetchAtMost(ctx context.Context, id cid.Cid, _ uint64, hints ...peer.ID) error {
	return b.Fetch(ctx, id, hints...)
}

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
	trainers := []string{"t1", "t2", "t3", "t4"}
	f := newFetchingRound(t, trainers...)
	v, r := f.v, f.r
	// Every fetch is under way before any has finished, and accept returned for each.
	started := map[cid.Cid]bool{}
	for range trainers {
		select {
		case id := <-f.gb.started:
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
	v.accept(r, "t1", f.contribution(f.leases[0]))
	require.Equal(t, map[string]uint64{"replay": 1}, rejections(v))

	f.finish(t, "t3", nil) // the last one announced arrives first
	require.Equal(t, []string{"t3"}, receivedPeers(r))
	f.finish(t, "t1", nil)
	require.Equal(t, []string{"t1", "t3"}, receivedPeers(r))
	f.finish(t, "t2", errors.New("holder went away"))
	require.Equal(t, map[string]uint64{"replay": 1, "unavailable": 1}, rejections(v))
	require.True(t, v.quarantine.Quarantined("t2", fetchRound+1), "an update that cannot be fetched is the trainer's fault")

	// At the deadline t4's update is still on its way: announced in time, it keeps its
	// lease (the deadline expires only leases with nothing announced), and counts when it
	// arrives.
	v.expire(r)
	require.False(t, r.book.Settled(), "the round waits for t4's update")
	require.Empty(t, r.book.Barred()["t4"])
	f.finish(t, "t4", nil)
	require.Equal(t, []string{"t1", "t3", "t4"}, receivedPeers(r))
	require.True(t, r.book.Settled())
	require.Equal(t, map[string]uint64{"replay": 1, "unavailable": 1}, rejections(v), "no late rejection")
}

// TestUpdateArrivingAfterItsLeaseEnded: an update whose trainer gave its lease back while
// it was on its way is not counted; one whose transfer fails after the deadline is late,
// without a strike.
func TestUpdateArrivingAfterItsLeaseEnded(t *testing.T) {
	f := newFetchingRound(t, "t1", "t2")
	v, r := f.v, f.r
	<-f.gb.started
	<-f.gb.started
	v.release(r, "t1", &gossip.Release{Round: fetchRound, Base: f.base.Bytes(), Lease: f.leases[0].ID().Bytes(), Peer: "t1",
		Reason: "worker restarted"})
	r.deadline = time.Now().Add(-time.Second) // the attempt's deadline has passed
	v.expire(r)
	require.Empty(t, r.book.Barred()["t2"], "t2's update is arriving")
	f.finish(t, "t1", nil)
	f.finish(t, "t2", errors.New("stream reset"))
	require.Empty(t, r.received, "t1 gave its lease back; t2's update never came")
	require.Equal(t, map[string]uint64{"late": 1}, rejections(v))
	require.Equal(t, "late", r.book.Barred()["t2"])
	require.False(t, v.quarantine.Quarantined("t2", fetchRound+1), "a transfer lost after the deadline is no strike")
	require.True(t, r.book.Settled())
}

// fetchingRound is a leader of round 4 that granted each of trainers a lease of one
// microshard and accepted their contributions, whose updates (stored already) are being
// fetched through gb: each fetch waits for its gate.
type fetchingRound struct {
	v      *validator
	r      *openRound
	gb     *gatedBus
	base   cid.Cid
	leases []lease.Lease
	deltas map[string]cid.Cid
}

const fetchRound = 4

func newFetchingRound(t *testing.T, trainers ...string) *fetchingRound {
	t.Helper()
	f := newLeasedRound(t, trainers...)
	for _, l := range f.leases {
		f.v.accept(f.r, l.Trainer, f.contribution(l))
	}
	return f
}

// newLeasedRound is newFetchingRound before any contribution was announced.
func newLeasedRound(t *testing.T, trainers ...string) *fetchingRound {
	t.Helper()
	f := &fetchingRound{base: cids.Record([]byte("base of round 4")), deltas: map[string]cid.Cid{},
		gb: &gatedBus{started: make(chan cid.Cid, 8), gates: map[cid.Cid]chan error{}}}
	f.v, f.r = leadingValidator(t, "A", []string{"A"}, fetchRound, f.base, &chain.Head{Round: fetchRound - 1})
	store, err := artifact.OpenStore(filepath.Join(t.TempDir(), "artifacts"), artifact.Options{})
	require.NoError(t, err)
	f.v.Bus, f.v.Store = f.gb, store
	f.r.deadline = time.Now().Add(time.Hour)
	for i, p := range trainers {
		l := lease.Lease{Round: fetchRound, Base: f.base.Bytes(), Trainer: p, Microshards: []uint32{uint32(i)}, Issuer: "A", Expiry: 1}
		f.leases = append(f.leases, l)
		f.r.leases[l.ID()] = l
		f.r.all = append(f.r.all, l)
		f.deltas[p], err = store.PutBytes(fmt.Appendf(nil, "update of %s", p))
		require.NoError(t, err)
		f.gb.gates[f.deltas[p]] = make(chan error, 1)
	}
	f.r.book.Grant(f.leases)
	return f
}

func (f *fetchingRound) contribution(l lease.Lease) *gossip.Contribution {
	return &gossip.Contribution{Round: fetchRound, Base: f.base.Bytes(), Lease: l.ID().Bytes(), Peer: l.Trainer,
		Delta: f.deltas[l.Trainer].Bytes(), Microshards: l.Microshards, Samples: 8, Seconds: 2}
}

// finish opens p's gate with err and hands the fetch's result to the leader.
func (f *fetchingRound) finish(t *testing.T, p string, err error) {
	t.Helper()
	f.gb.gates[f.deltas[p]] <- err
	select {
	case res := <-f.r.fetches.done:
		require.Equal(t, p, res.from)
		f.v.fetchedDelta(f.r, res)
	case <-time.After(10 * time.Second):
		t.Fatalf("the fetch of %s did not report back", p)
	}
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
		_, id := testenv.Key(t, name)
		ids[name] = mustPeer(t, id)
	}
	v, _ := leadingValidator(t, "A", []string{"A", ids["proposer"].String()}, round, base, &chain.Head{Round: round - 1})
	heads, err := chain.OpenStore(filepath.Join(t.TempDir(), "heads"))
	require.NoError(t, err)
	gb := &gatedBus{started: make(chan cid.Cid, 8), gates: map[cid.Cid]chan error{}}
	v.Bus, v.Heads = gb, heads
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

// TestTrainerBackWhileItsUpdateWasOnItsWay: a trainer announces its update and is killed
// before the update arrives (the fetch hangs on the dead connection); it comes back as a
// new process and is leased again. The fetch of the old process's update is dropped: the
// new process's contribution, with the same update (same base, same microshards), is not
// taken for a replay of the old one, the old fetch's end is not counted, and the new
// update counts when it arrives.
func TestTrainerBackWhileItsUpdateWasOnItsWay(t *testing.T) {
	f := newFetchingRound(t, "t1")
	v, r := f.v, f.r
	<-f.gb.started
	announce := func(started int64) *gossip.Announce {
		return &gossip.Announce{Peer: "t1", Roles: []string{config.RoleTrainer}, Time: time.Now().UnixMilli(), Started: started}
	}
	v.trainers.seen("t1", announce(1))
	r.returns["t1"] = v.trainers.returns("t1")
	in := bus.NewInbox(func() {})
	in.Announces <- bus.Received[gossip.Announce]{From: "t1", Msg: announce(2)}
	v.noticeReturns(r, in)
	require.Empty(t, r.book.Barred()["t1"], "t1 is back and may be leased again")

	again := f.leases[0]
	again.Expiry = 2
	r.leases[again.ID()] = again
	r.book.Grant([]lease.Lease{again})
	v.accept(r, "t1", f.contribution(again))
	require.Empty(t, rejections(v), "the new process's contribution is no replay")
	select {
	case <-f.gb.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the new update's fetch did not start")
	}
	select {
	case res := <-r.fetches.done: // the dropped fetch, cancelled
		require.ErrorIs(t, res.err, context.Canceled)
		v.fetchedDelta(r, res)
	case <-time.After(10 * time.Second):
		t.Fatal("the dropped fetch did not end")
	}
	require.Empty(t, r.received, "the dropped fetch's end is not counted")
	require.Empty(t, rejections(v))
	f.finish(t, "t1", nil)
	require.Equal(t, []string{"t1"}, receivedPeers(r))
	require.True(t, r.book.Settled())
}

// TestTrainerOutOfTouchForSecondsStillCounts: a trainer behind a router that forgot its
// mappings is not heard for longer than gossip.LiveFor, and its lease is settled (its
// microshards would go back to the pool for the next attempt); it trained on, and its
// contribution on that lease arrives while the attempt is open: it counts. After the
// attempt's deadline it is late, as any contribution.
func TestTrainerOutOfTouchForSecondsStillCounts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // from now
		counts   bool
	}{
		{"within the attempt", time.Hour, true},
		{"after its deadline", -time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLeasedRound(t, "t1", "t2")
			v, r := f.v, f.r
			t0 := time.Now()
			v.trainers.now = func() time.Time { return t0 }
			for _, p := range []string{"t1", "t2"} {
				v.trainers.seen(p, &gossip.Announce{Peer: p, Roles: []string{config.RoleTrainer}, Time: t0.UnixMilli(), Started: 1})
				r.returns[p] = v.trainers.returns(p)
			}
			f.v.accept(r, "t2", f.contribution(f.leases[1]))
			<-f.gb.started
			f.finish(t, "t2", nil)

			v.trainers.now = func() time.Time { return t0.Add(gossip.LiveFor + time.Second) } // t1 silent
			v.noticeReturns(r, bus.NewInbox(func() {}))
			require.Equal(t, map[string]string{"t1": lease.ReasonGone}, r.book.Barred())
			require.True(t, r.book.Settled(), "t1's lease was settled for its silence")

			r.deadline = time.Now().Add(tc.deadline)
			v.accept(r, "t1", f.contribution(f.leases[0]))
			if !tc.counts {
				require.Equal(t, map[string]uint64{"late": 1}, rejections(v))
				return
			}
			require.Empty(t, rejections(v))
			require.Empty(t, r.book.Barred())
			require.False(t, r.book.Settled(), "t1 holds its lease again while its update is on its way")
			v.noticeReturns(r, bus.NewInbox(func() {}))
			require.Empty(t, r.book.Barred(), "its contribution was a sign of life: not silent again")
			<-f.gb.started
			f.finish(t, "t1", nil)
			require.Equal(t, []string{"t1", "t2"}, receivedPeers(r))
			require.True(t, r.book.Settled())
		})
	}
}

// TestUpdateLargerThanItsEncodingAllows: an update whose manifest gives more bytes than the
// experiment's encoding can take is not downloaded (artifact.ErrTooLarge) and is rejected
// wrong_codec, with a strike, as the merge would reject its encoding.
func TestUpdateLargerThanItsEncodingAllows(t *testing.T) {
	f := newFetchingRound(t, "t1", "t2")
	v, r := f.v, f.r
	for range 2 {
		<-f.gb.started
	}
	f.finish(t, "t1", fmt.Errorf("fetch artifact %s: %w: 4194304 bytes, at most 70000", f.deltas["t1"], artifact.ErrTooLarge))
	require.Equal(t, map[string]uint64{round.ReasonWrongCodec: 1}, rejections(v))
	require.True(t, v.quarantine.Quarantined("t1", fetchRound+1), "a dense update in a sparse swarm is the trainer's doing")
	f.finish(t, "t2", nil)
	require.Equal(t, []string{"t2"}, receivedPeers(r))
}
