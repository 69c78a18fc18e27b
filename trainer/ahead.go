package trainer

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
)

// Eager is what a trainer trains with under protocol.overlap: eager (round.Trainer).
//
// A lease may reserve the trainer's microshards for the next round (lease.Lease.Next).
// Having published its update, the trainer does not wait for the next head: it trains
// the reservation ahead, from its eager guess at that head (below), as soon as every
// trainer leased with it in the round has published its update too (updates.go).
// When the next round's lease comes and grants exactly the reservation (same round,
// microshards and steps), the window trained ahead is its window. If it is still training,
// it is moved onto the lease's base head (the head it guessed at) before its next step,
// keeping the progress made so far (round.Trainer.MoveAhead), so the steps left start
// from the real head. Its update is what the window moved the model by (from where it
// started, or from the head once moved, to its end), published on the lease's base head
// like any other. The trainer then goes on from its eager guess at the next head: that
// head, plus its own progress as its 1/N share of the next merge, plus the others' shares
// taken to be what they were in that head's merge (round.Window.Rebase). Any other lease,
// or none by the time the round it was for has closed, drops the window trained ahead
// (its optimizer state too) and the trainer trains as without overlap.
type Eager interface {
	RunWindow(ctx context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*round.Window, error)
	RunWindowFrom(ctx context.Context, start string, round uint64, microshards []uint32, steps int, seed int64) (*round.Window, error)
	MoveAhead(round uint64, base *chain.Head) error
}

// aheadWindow is a window training, or trained, ahead of its lease.
type aheadWindow struct {
	round       uint64
	microshards []uint32
	steps       int
	cancel      context.CancelFunc
	started     chan struct{} // closed when it stops waiting for the round's updates
	startErr    error         // why it did not start (set before started is closed)
	done        chan struct{}
	w           *round.Window // once done, with err nil
	err         error
}

// startAhead trains l's reservation from the trainer's eager guess at the next head,
// made from window w (trained for l, on base), once the trainers in peers (leased with it)
// have published their updates for l's round (updates.go).
func (t *Trainer) startAhead(ctx context.Context, w *round.Window, base *chain.Head, l lease.Lease, peers []string) {
	if len(l.Next) == 0 || l.NextSteps == 0 || config.RoundLimitReached(t.Rounds, l.Round) {
		return
	}
	start, err := t.rebaseAhead(w, base)
	if err != nil {
		t.Log.Warn("not training ahead", "round", l.Round+1, "err", err)
		return
	}
	t.ahead = t.launchAhead(ctx, start, l.Round+1, l.Next, int(l.NextSteps), peers)
}

// launchAhead starts training a window for round from the pack at start, once the
// trainers in peers have published their updates for the round before (awaitUpdates).
func (t *Trainer) launchAhead(ctx context.Context, start string, round uint64, microshards []uint32, steps int, peers []string) *aheadWindow {
	ctx, cancel := context.WithCancel(ctx)
	a := &aheadWindow{round: round, microshards: microshards, steps: steps, cancel: cancel, started: make(chan struct{}), done: make(chan struct{})}
	// The attempt of the lease to come is not known yet: a window trained ahead draws its
	// batches as attempt 0 would.
	seed := Seed(t.Seed, round, 0, t.Self)
	go func() {
		defer close(a.done)
		waited, err := t.awaitUpdates(ctx, round-1, peers)
		a.startErr = err
		close(a.started)
		if err != nil {
			return
		}
		t.Log.Info("training ahead", "round", round, "microshards", len(microshards), "steps", steps,
			"waited_for_updates_seconds", fmt.Sprintf("%.2f", waited.Seconds()))
		a.w, a.err = t.Eager.RunWindowFrom(ctx, start, round, microshards, steps, seed)
	}()
	return a
}

// takeAhead returns the window trained ahead for lease l (of steps steps) on base, once it
// is trained, or nil when there is none for it (one for another lease is dropped). A window
// still training is first moved onto base. ctx bounds the wait.
func (t *Trainer) takeAhead(ctx context.Context, l lease.Lease, base *chain.Head, steps int) *round.Window {
	a := t.ahead
	if a == nil {
		return nil
	}
	t.ahead = nil
	if a.round != l.Round || a.steps != steps || !slices.Equal(a.microshards, l.Microshards) {
		t.dropAhead(a, "the lease is not the reservation")
		return nil
	}
	waitStart := time.Now()
	// A window still waiting for its round's updates stops waiting (base is canonical
	// here) and is not trained: the lease is trained from base.
	select {
	case <-a.started:
	default:
		select {
		case <-a.started:
		case <-ctx.Done():
			t.dropAhead(a, "the lease ended first")
			return nil
		}
	}
	if a.startErr != nil { // the head came first (errHeadFirst), or the run ended
		<-a.done
		t.Log.Info("not trained ahead: training the lease from its base", "round", a.round, "why", a.startErr)
		return nil
	}
	select {
	case <-a.done:
	default:
		if err := t.Eager.MoveAhead(a.round, base); err != nil {
			t.Log.Warn("could not move the window trained ahead onto its head: its update is measured from its start", "round", a.round, "err", err)
		}
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		t.dropAhead(a, "the lease ended first")
		return nil
	}
	if a.err != nil {
		t.Log.Warn("window trained ahead failed: training the lease from its base", "round", a.round, "err", a.err)
		t.Sink.Event("overlap", "round %d: the window trained ahead failed (%v); training the lease from its base", a.round, a.err)
		return nil
	}
	t.Log.Info("took the window trained ahead", "round", a.round, "moved_at_step", a.w.MovedAt(), "waited_seconds", time.Since(waitStart).Seconds())
	a.w.Take()
	return a.w
}

// dropAhead stops and removes a window trained ahead.
func (t *Trainer) dropAhead(a *aheadWindow, why string) {
	a.cancel()
	<-a.done
	if a.w != nil {
		a.w.Drop()
	}
	t.Log.Info("dropped the window trained ahead", "round", a.round, "why", why)
	t.Sink.Event("overlap", "round %d: dropped the window trained ahead: %s", a.round, why)
}

// dropStaleAhead drops the window trained ahead once the round it was for has closed
// without a lease for it here (or the run ended).
func (t *Trainer) dropStaleAhead() {
	if t.ahead == nil {
		return
	}
	if _, h := t.Chain.Current(); h != nil && h.Round >= t.ahead.round {
		t.dropAhead(t.ahead, "its round closed")
		t.ahead = nil
	}
}

// eagerWindow trains lease l on base: the window trained ahead for it (ahead), or a new
// one.
func (t *Trainer) eagerWindow(ctx, wctx context.Context, base *chain.Head, l lease.Lease, steps int, seed int64) (w *round.Window, ahead bool, err error) {
	if w := t.takeAhead(wctx, l, base, steps); w != nil {
		return w, true, nil
	}
	if ctx.Err() != nil {
		return nil, false, ctx.Err()
	}
	w, err = t.Eager.RunWindow(wctx, base, l.Microshards, steps, seed)
	return w, false, err
}

// rebaseAhead writes where the trainer goes on from after window w, whose update was
// measured against base: round.Window.Rebase with base's parent and the updates base merged.
func (t *Trainer) rebaseAhead(w *round.Window, base *chain.Head) (string, error) {
	var parent *chain.Head
	if pid, err := cid.Cast(base.Parent); err == nil {
		if h, err := t.Chain.Head(pid); err == nil {
			parent = h // without it: the window's whole progress
		}
	}
	return w.Rebase(base, parent, len(base.Contributions))
}
