package trainer

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
)

// blockingEager trains ahead until its context ends, or fails at once with fail.
type blockingEager struct {
	fail     error
	canceled chan struct{}
	moved    []uint64 // the rounds MoveAhead was called for
}

func (e *blockingEager) MoveAhead(round uint64, _ *chain.Head) error {
	e.moved = append(e.moved, round)
	return nil
}

func (e *blockingEager) RunWindow(context.Context, *chain.Head, []uint32, int, int64) (*round.Window, error) {
	return nil, errors.New("not used")
}

func (e *blockingEager) RunWindowFrom(ctx context.Context, _ string, _ uint64, _ []uint32, _ int, _ int64) (*round.Window, error) {
	if e.fail != nil {
		return nil, e.fail
	}
	<-ctx.Done()
	close(e.canceled)
	return nil, ctx.Err()
}

// A window trained ahead is used only for the lease it was trained for: another lease, a
// lease that ends first, a failed window or a round that closed without its lease drop it
// (stopping the worker), and the trainer trains as without overlap.
func TestWindowTrainedAheadIsDroppedUnlessItsLeaseComes(t *testing.T) {
	reserved := lease.Lease{Round: 3, Microshards: []uint32{4, 5}}
	cases := []struct {
		name  string
		fail  error
		lease lease.Lease
		steps int
		ended bool // the lease's context ends before the window is trained
	}{
		{"other microshards", nil, lease.Lease{Round: 3, Microshards: []uint32{4, 6}}, 10, false},
		{"other round", nil, lease.Lease{Round: 4, Microshards: []uint32{4, 5}}, 10, false},
		{"other steps", nil, reserved, 11, false},
		{"the lease ends first", nil, reserved, 10, true},
		{"the window failed", errors.New("worker crashed"), reserved, 10, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := &blockingEager{fail: tc.fail, canceled: make(chan struct{})}
			sink := &testSink{}
			tr := New(Params{Sink: sink, Eager: e, Log: slog.New(slog.DiscardHandler)})
			tr.ahead = tr.launchAhead(context.Background(), "start", 3, []uint32{4, 5}, 10, nil)
			<-tr.ahead.started // with no trainer to wait for, it starts at once
			ctx, cancel := context.WithCancel(context.Background())
			if tc.ended {
				cancel()
			}
			defer cancel()
			require.Nil(t, tr.takeAhead(ctx, tc.lease, &chain.Head{Round: 2}, tc.steps))
			require.Nil(t, tr.ahead)
			switch {
			case tc.ended:
				require.Equal(t, []uint64{3}, e.moved, "a window still training for its lease is moved onto the lease's head")
			case tc.fail == nil:
				require.Empty(t, e.moved, "a window for another lease is not moved")
			}
			want := "overlap: round %d: dropped the window trained ahead: %s"
			if tc.fail != nil {
				want = "overlap: round %d: the window trained ahead failed (%v); training the lease from its base"
			}
			require.Equal(t, []string{want}, sink.events, "the status page says why")
			if tc.fail == nil {
				select {
				case <-e.canceled:
				case <-time.After(5 * time.Second):
					t.Fatal("the window trained ahead still runs")
				}
			}
		})
	}

	t.Run("its round closed", func(t *testing.T) {
		e := &blockingEager{canceled: make(chan struct{})}
		ch := &testChain{stored: map[cid.Cid]*chain.Head{}, changed: make(chan struct{})}
		tr := New(Params{Sink: &testSink{}, Eager: e, Chain: ch, Log: slog.New(slog.DiscardHandler)})
		tr.ahead = tr.launchAhead(context.Background(), "start", 3, []uint32{4, 5}, 10, nil)
		ch.head = &chain.Head{Round: 2}
		tr.dropStaleAhead()
		require.NotNil(t, tr.ahead, "round 3 is still open: its lease may come")
		ch.head = &chain.Head{Round: 3}
		tr.dropStaleAhead()
		require.Nil(t, tr.ahead)
		<-e.canceled
	})
}

// startingEager records when a window ahead starts, then trains until its context ends.
type startingEager struct {
	blockingEager
	started chan struct{}
}

func (e *startingEager) RunWindowFrom(ctx context.Context, start string, round uint64, ms []uint32, steps int, seed int64) (*round.Window, error) {
	close(e.started)
	return e.blockingEager.RunWindowFrom(ctx, start, round, ms, steps, seed)
}

// A window trained ahead for round 3 starts once every other trainer leased in round 2 has
// published its update for round 2 (updates of other rounds or peers do not count); when
// round 2's head comes first it never starts, and its lease is trained from the head.
func TestWindowAheadWaitsForTheRoundsLastUpdate(t *testing.T) {
	notYet := func(e *startingEager, why string) {
		t.Helper()
		select {
		case <-e.started:
			t.Fatalf("the window ahead started %s", why)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Run("the last update", func(t *testing.T) {
		e := &startingEager{blockingEager{canceled: make(chan struct{})}, make(chan struct{})}
		ch := &testChain{stored: map[cid.Cid]*chain.Head{}, changed: make(chan struct{})}
		tr := New(Params{Sink: &testSink{}, Eager: e, Chain: ch, Log: slog.New(slog.DiscardHandler)})
		tr.updates = newUpdates()
		tr.updates.heard(2, 1, "b")
		tr.ahead = tr.launchAhead(context.Background(), "start", 3, []uint32{4, 5}, 10, []string{"b", "c"})
		notYet(e, "before c's update")
		tr.updates.heard(1, 1, "c")
		tr.updates.heard(2, 1, "x")
		notYet(e, "on updates of another round or trainer")
		tr.updates.heard(2, 1, "c")
		select {
		case <-e.started:
		case <-time.After(5 * time.Second):
			t.Fatal("the window ahead did not start after the round's last update")
		}
		tr.dropAhead(tr.ahead, "test over")
	})
	t.Run("the head first", func(t *testing.T) {
		e := &startingEager{blockingEager{canceled: make(chan struct{})}, make(chan struct{})}
		ch := &testChain{stored: map[cid.Cid]*chain.Head{}, changed: make(chan struct{})}
		tr := New(Params{Sink: &testSink{}, Eager: e, Chain: ch, Log: slog.New(slog.DiscardHandler)})
		tr.updates = newUpdates()
		tr.ahead = tr.launchAhead(context.Background(), "start", 3, []uint32{4, 5}, 10, []string{"b"})
		notYet(e, "without b's update")
		base := &chain.Head{Round: 2}
		ch.set(ch.add(base))
		require.Nil(t, tr.takeAhead(context.Background(), lease.Lease{Round: 3, Microshards: []uint32{4, 5}}, base, 10))
		require.Empty(t, e.moved, "a window that never started is not moved")
		notYet(e, "after its head came")
	})
}

// The updates remembered are those of the two rounds after the canonical head's, at most
// maxHeardPerRound a round: forged rounds far ahead or behind, or a flood of peers, do not
// grow them.
func TestUpdatesKeepOnlyTheOpenRounds(t *testing.T) {
	cases := []struct {
		name  string
		round uint64
		cur   uint64
		kept  bool
	}{
		{"the open round", 5, 4, true},
		{"the round after", 6, 4, true},
		{"the head's own round", 4, 4, false},
		{"an old round", 2, 4, false},
		{"far ahead", 1 << 40, 4, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := newUpdates()
			u.heard(tc.round, tc.cur, "p")
			ok, _ := u.all(tc.round, []string{"p"})
			require.Equal(t, tc.kept, ok)
		})
	}
	u := newUpdates()
	u.heard(5, 4, "p")
	u.heard(6, 5, "q") // the head moved to round 5: round 5's updates are forgotten
	ok, _ := u.all(5, []string{"p"})
	require.False(t, ok)
	require.Len(t, u.rounds, 1)
	for i := range maxHeardPerRound + 10 {
		u.heard(6, 5, strconv.Itoa(i))
	}
	require.Len(t, u.rounds[6], maxHeardPerRound)
}
