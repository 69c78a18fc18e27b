package validator

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/round"
)

// deltaFetches runs the round leader's fetches of accepted contributions' updates, one
// goroutine each, and hands each result back to the leader's loop (collect, issue), which
// finishes the acceptance there (fetchedDelta). The loop never waits on a transfer: the
// trainers' uploads proceed side by side (with the fetch inside the loop, three trainers
// on 20 Mbit/s uplinks uploaded one after another), and grants, releases, announces and
// heads are read while they do. The attempt's deadline is for announcing a contribution:
// an update announced in time keeps its lease past the deadline until it arrives (expire),
// within lease.round_timeout.
type deltaFetches struct {
	ctx     context.Context
	cancel  context.CancelFunc
	wg      *sync.WaitGroup // the fetches running: the validator's, joined when its run ends
	done    chan fetchResult
	pending map[string]pendingFetch // by trainer
	next    uint64                  // the number of the next fetch started
}

// pendingFetch is an accepted contribution whose update is on its way.
type pendingFetch struct {
	rc     received
	delta  cid.Cid
	start  time.Time
	seq    uint64             // which fetch of the round it is (fetchResult.seq)
	cancel context.CancelFunc // ends it (drop)
}

type fetchResult struct {
	from  string
	delta cid.Cid
	seq   uint64
	err   error
}

// newDeltaFetches starts the fetches of one round, each counted in wg; stop cancels what
// is still running (the owner of wg joins them).
func newDeltaFetches(ctx context.Context, wg *sync.WaitGroup) *deltaFetches {
	ctx, cancel := context.WithCancel(ctx)
	return &deltaFetches{ctx: ctx, cancel: cancel, wg: wg, done: make(chan fetchResult), pending: map[string]pendingFetch{}}
}

func (f *deltaFetches) stop() { f.cancel() }

// start fetches the update of rc (artifact delta, at most max bytes: 0 for any) from hint
// and the holders the bus knows, until deadline. Its result arrives on done unless the
// round ends first.
func (f *deltaFetches) start(b bus.Bus, from string, rc received, delta cid.Cid, hint peer.ID, max uint64, deadline time.Time) {
	ctx, cancel := context.WithDeadline(f.ctx, deadline)
	seq := f.next
	f.next++
	f.pending[from] = pendingFetch{rc: rc, delta: delta, start: time.Now(), seq: seq, cancel: cancel}
	f.wg.Go(func() {
		defer cancel()
		err := b.FetchAtMost(ctx, delta, max, hint)
		select {
		case f.done <- fetchResult{from: from, delta: delta, seq: seq, err: err}:
		case <-f.ctx.Done():
		}
	})
}

// finish takes the pending fetch res reports on; false when there is none (the round
// settled that trainer's lease meanwhile, or dropped the fetch res is of).
func (f *deltaFetches) finish(res fetchResult) (pendingFetch, bool) {
	p, ok := f.pending[res.from]
	if !ok || p.seq != res.seq {
		return pendingFetch{}, false
	}
	delete(f.pending, res.from)
	return p, true
}

// drop ends the fetch of from's update, if one is on its way: the round settled its lease
// otherwise (the trainer left). What it reports is not counted, and a contribution the
// trainer makes on a later lease of the round is not taken for a replay of this one. (A
// trainer killed after it announced its update comes back as a new process and is leased
// again; with the old fetch still pending — hung on the dead connection — its new update
// was rejected as a second contribution, and the round waited out that fetch and then the
// new lease's deadline.)
func (f *deltaFetches) drop(from string) {
	if p, ok := f.pending[from]; ok {
		p.cancel()
		delete(f.pending, from)
	}
}

// fetchedDelta finishes accepting a contribution whose update was fetched (or failed to
// be): the trainer reports on its lease, or is rejected as accept would have.
func (v *validator) fetchedDelta(r *openRound, res fetchResult) {
	p, ok := r.fetches.finish(res)
	if !ok {
		return
	}
	from, c, l := res.from, p.rc.msg, p.rc.lease
	if !r.book.Holds(from, p.rc.id) {
		// Its lease was settled while the update was on its way (the trainer left or gave
		// the lease back): what arrives now is not counted.
		v.Log.Debug("update fetched after its lease was settled; not counted", "round", r.round, "peer", from, "delta", res.delta.String())
		return
	}
	if errors.Is(res.err, artifact.ErrTooLarge) {
		// Its manifest gives more bytes than the experiment's encoding can take: not
		// fetched, and rejected as the merge would reject its encoding.
		v.rejectContribution(r, from, c.Delta, true, round.ReasonWrongCodec, "fetch delta %s: %v", res.delta, res.err)
		return
	}
	if res.err != nil || !v.Store.Has(res.delta) {
		if !time.Now().Before(r.deadline) {
			// The transfer failed after the attempt's deadline (it ran past
			// lease.round_timeout, or its holder went away): late, no strike toward
			// quarantine, as a trainer that announced in time is not at fault for its link.
			v.rejectContribution(r, from, c.Delta, true, "late", "fetch delta %s: the attempt's deadline passed: %v", res.delta, res.err)
			return
		}
		v.rejectContribution(r, from, c.Delta, true, reasonUnavailable, "fetch delta %s: %v", res.delta, res.err)
		return
	}
	steps := int(l.Steps)
	if steps == 0 {
		steps = v.Config.Protocol.InnerSteps
	}
	v.paces.observe(from, c.Seconds, steps)
	v.noteSpeed(from, c, steps)
	rc := p.rc
	rc.fetch = time.Since(p.start)
	r.received[from] = rc
	r.book.Report(from)
	v.Sink.Status(func(vs *Status) {
		vs.Received = append(slices.Clone(vs.Received), from)
	})
}

// reasonUnavailable rejects a contribution whose update could not be fetched from its
// trainer.
const reasonUnavailable = "unavailable"
