package validator

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// The validator is one event loop (run) over named phases. Each phase is a value that
// holds its state and takes in the loop's events; it hands over to the next by returning
// it:
//
//	waiting (for genesis)
//	following ──takeover──> leading: issuing <-> collecting, proposing
//	                                 standing aside ──retake──> leading again
//	following, leading ──signed a head of the round──> awaiting quorum
//
// and every phase starts over from the canonical head when it moves on. The fetches of
// contributions' updates (fetches.go) and the checks of other validators' proposals
// (checks.go) run in goroutines and come back as events; the loop itself blocks only in the
// leader's own merge.

// phase is one of the validator's phases.
type phase interface {
	// begin enters the phase. It may hand over at once (a non-nil next).
	begin(ctx context.Context, in *bus.Inbox) (*next, error)
	// on takes in an event.
	on(ctx context.Context, in *bus.Inbox, ev event) (*next, error)
	// moved is told that the canonical head changed.
	moved() *next
	// waits says what the loop waits on for the phase.
	waits() waits
	// end releases what the phase holds; the loop calls it when the phase hands over or the
	// loop stops.
	end()
}

// waits is what the loop waits on for a phase besides the checks' verdicts: the inbox's
// messages of the kinds it reads (those of other kinds stay queued for a phase that reads
// them: the grants a validator awaiting a quorum leaves unread tell the next round's
// follower when its leader's deadline is), its timer and ticker, and its fetches' results
// (nil: none).
type waits struct {
	reads      kinds
	wake, tick <-chan time.Time
	fetched    <-chan fetchResult
}

// kinds is a set of the inbox's kinds of message.
type kinds uint8

const (
	readsAnnounces kinds = 1 << iota
	readsLeases
	readsContributions
	readsReleases
	readsAttestations
	readsHeads
	readsAll = readsAnnounces | readsLeases | readsContributions | readsReleases | readsAttestations | readsHeads
)

// from is ch when k is in the set, nil (never ready) otherwise.
func from[T any](ks kinds, k kinds, ch chan bus.Received[T]) chan bus.Received[T] {
	if ks&k == 0 {
		return nil
	}
	return ch
}

// event is one thing the loop heard: a message, a check's verdict, a fetch's result, or
// the phase's timer or ticker.
type event struct {
	announce     *bus.Received[gossip.Announce]
	leases       *bus.Received[gossip.Leases]
	contribution *bus.Received[gossip.Contribution]
	release      *bus.Received[gossip.Release]
	attestation  *bus.Received[gossip.Attestation]
	head         *bus.Received[gossip.Head]
	checked      *checkResult
	fetched      *fetchResult
	wake, tick   bool
}

// next is the phase a phase hands over to: awaiting the quorum of the head this validator
// signed for a round (lock set), or leading a round on base from attempt (after a takeover,
// or again after stepping aside). The zero value starts over from the canonical head.
type next struct {
	round   uint64 // the round of lock
	lock    *lockedHead
	lead    bool
	baseID  cid.Cid
	base    *chain.Head
	attempt uint64
	// held are the verdicts a leader that stood aside still holds: leading the round
	// again, it settles them by the round's end, as if it had led it throughout.
	held map[heldKey]string
}

// awaiting is the hand-over to awaiting the quorum of l, the head signed for round.
func awaiting(round uint64, l lockedHead) *next { return &next{round: round, lock: &l} }

// leading is the hand-over to leading the round after base from attempt.
func leading(baseID cid.Cid, base *chain.Head, attempt uint64) *next {
	return &next{lead: true, baseID: baseID, base: base, attempt: attempt}
}

// startOver is the hand-over to the phase the canonical head calls for.
func startOver() *next { return &next{} }

func (v *validator) run(ctx context.Context) error {
	in := v.Bus.Subscribe()
	defer in.Close()
	// What runs off the loop (checks, fetches) ends with the run: cancelled (the deferred
	// cancel runs first), then joined.
	defer v.work.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer v.startHeldOut(ctx)()
	if err := v.ensureGenesis(ctx); err != nil {
		return err
	}
	var ph phase
	defer func() {
		if ph != nil {
			ph.end()
		}
	}()
	n := startOver()
	var changed <-chan struct{}
	for {
		var err error
		if n != nil {
			if ph != nil {
				ph.end()
			}
			// Taken before the phase reads the canonical head: a move after that fires it.
			changed = v.Tips.Changed()
			ph = v.phaseFor(*n)
			n, err = ph.begin(ctx, in)
		} else {
			var ev event
			w := ph.waits()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-changed:
				changed = v.Tips.Changed()
				n = ph.moved()
				continue
			case a := <-from(w.reads, readsAnnounces, in.Announces):
				v.trainers.seen(a.From, a.Msg)
				ev.announce = &a
			case l := <-from(w.reads, readsLeases, in.Leases):
				ev.leases = &l
			case c := <-from(w.reads, readsContributions, in.Contributions):
				ev.contribution = &c
			case rl := <-from(w.reads, readsReleases, in.Releases):
				ev.release = &rl
			case a := <-from(w.reads, readsAttestations, in.Attestations):
				ev.attestation = &a
			case h := <-from(w.reads, readsHeads, in.Heads):
				ev.head = &h
			case res := <-v.checks.done:
				ev.checked = &res
			case res := <-w.fetched:
				ev.fetched = &res
			case <-w.wake:
				ev.wake = true
			case <-w.tick:
				ev.tick = true
			}
			n, err = ph.on(ctx, in, ev)
		}
		switch {
		case err == nil:
		case errors.Is(err, errHeadMoved):
			n = startOver()
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			_, head := v.Tips.Current()
			v.Log.Error("round failed", "round", roundOf(head), "err", err)
			v.Sink.Event("round", "round %d failed: %v", roundOf(head), err)
			n = startOver()
			ph.end() // no heartbeat or fetch of the failed round goes on through the back-off
			ph = nil
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
}

// phaseFor is the phase n hands over to; from the canonical head: waiting for genesis,
// awaiting the quorum of this validator's genesis, idle once the experiment's last round is
// recorded, or the validator's part in the round after the head — leading it when it is
// first in the order, following otherwise.
func (v *validator) phaseFor(n next) phase {
	switch {
	case n.lock != nil:
		return &awaitingPhase{v: v, round: n.round, lock: *n.lock}
	case n.lead:
		return &leadPhase{v: v, baseID: n.baseID, base: n.base, firstAttempt: n.attempt, held: n.held}
	case v.done(): // the node ends the run once it has recorded the last head
		return idlePhase{}
	}
	baseID, base := v.Tips.Current()
	if base == nil {
		if l, locked := v.locks[0]; locked {
			return &awaitingPhase{v: v, round: 0, lock: l} // our genesis, waiting for attestations
		}
		return &waitingPhase{v: v}
	}
	v.pruneLocks(base.Round)
	v.forgetClosed(base.Round)
	v.checks.closed(base.Round)
	order := lease.Leaders(v.Validators, baseID)
	rank := slices.Index(order, v.Self)
	if rank == 0 {
		return &leadPhase{v: v, baseID: baseID, base: base}
	}
	return &followPhase{v: v, baseID: baseID, base: base, rank: rank, order: order}
}

func roundOf(h *chain.Head) uint64 {
	if h == nil {
		return 0
	}
	return h.Round + 1
}

// idlePhase is the validator once the experiment's last round is recorded: the node ends
// the run.
type idlePhase struct{}

func (idlePhase) begin(context.Context, *bus.Inbox) (*next, error)     { return nil, nil }
func (idlePhase) on(context.Context, *bus.Inbox, event) (*next, error) { return nil, nil }
func (idlePhase) moved() *next                                         { return nil }
func (idlePhase) waits() waits                                         { return waits{} }
func (idlePhase) end()                                                 {}

// waitingPhase waits for a canonical head (genesis from another validator), checking and
// attesting it.
type waitingPhase struct{ v *validator }

func (p *waitingPhase) begin(context.Context, *bus.Inbox) (*next, error) {
	p.v.enter(PhaseWaiting, 0)
	if id, _ := p.v.Tips.Current(); id.Defined() {
		return startOver(), nil // genesis arrived before the loop took changed
	}
	return nil, nil
}

func (p *waitingPhase) on(ctx context.Context, _ *bus.Inbox, ev event) (*next, error) {
	v := p.v
	switch {
	case ev.leases != nil:
		v.recordGrant(*ev.leases)
	case ev.head != nil:
		v.proposed(ctx, ev.head.From, ev.head.Msg)
	case ev.checked != nil:
		v.checkDone(ctx, *ev.checked)
	}
	return nil, nil
}

func (p *waitingPhase) moved() *next { return startOver() }
func (p *waitingPhase) waits() waits {
	return waits{reads: readsAnnounces | readsLeases | readsContributions | readsHeads}
}
func (p *waitingPhase) end() {}

// awaitingPhase keeps a signed proposal in circulation until the canonical head moves on
// (quorum reached here or elsewhere): a validator that has signed a head for a round signs
// no other. A takeover of the round heard now changes nothing here: this validator is
// locked, its proposal and the new leader's compete for the validators that signed
// neither, and whichever reaches quorum ends this wait (stepaside.go).
type awaitingPhase struct {
	v     *validator
	round uint64
	lock  lockedHead
	t     *time.Timer
}

func (p *awaitingPhase) begin(context.Context, *bus.Inbox) (*next, error) {
	p.v.enter(PhaseAwaitingQuorum, p.round)
	// The first re-publish comes after heartbeatEvery, within a follower's silence window
	// (LeaseWait): it tells the followers that already have the quorum that this validator
	// is still waiting for it (follow, baseStillOpen), and they send their attestations
	// again.
	p.t = time.NewTimer(heartbeatEvery)
	return p.moved(), nil
}

func (p *awaitingPhase) moved() *next {
	if _, h := p.v.Tips.Current(); h != nil && h.Round >= p.round {
		return startOver()
	}
	return nil
}

func (p *awaitingPhase) on(ctx context.Context, _ *bus.Inbox, ev event) (*next, error) {
	v := p.v
	switch {
	case ev.head != nil:
		v.proposed(ctx, ev.head.From, ev.head.Msg)
	case ev.checked != nil:
		v.checkDone(ctx, *ev.checked)
	case ev.wake:
		msg := *p.lock.msg
		if sh, _, err := v.Heads.Get(p.lock.id); err == nil {
			msg.Signed = *sh // with every signature gathered so far
		}
		msg.Sent = time.Now().UnixMilli()
		if err := v.Bus.Publish(ctx, &msg); err != nil {
			v.Log.Debug("re-publish proposal", "round", p.round, "err", err)
		}
		p.t.Reset(republishEvery)
	}
	return nil, nil
}

func (p *awaitingPhase) waits() waits { return waits{reads: readsAnnounces | readsHeads, wake: p.t.C} }

func (p *awaitingPhase) end() {
	if p.t != nil {
		p.t.Stop()
	}
}
