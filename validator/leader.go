package validator

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/merge"
)

// Round timing of the leader.
const (
	republishEvery = 3 * time.Second // a proposal waiting for quorum is sent again
	replayWindow   = 64              // rounds back in which a merged delta counts as a replay, and over which a peer earns trust (round.OnProbation)
	heartbeatEvery = time.Second     // a leader waiting within its round says it is alive
)

// openRound is the leader's state for the round it runs.
type openRound struct {
	round    uint64
	baseID   cid.Cid
	base     *chain.Head
	attempt  uint64
	granted  bool                    // an attempt was granted (the next one increments attempt)
	leases   map[cid.Cid]lease.Lease // the current attempt's
	all      []lease.Lease           // every lease granted for the round (for the proposal)
	received map[string]received     // by trainer, across attempts
	deadline time.Time
	window   time.Duration    // the last attempt's deadline, from its grant
	merged   map[cid.Cid]bool // deltas merged in recent rounds: a replay is rejected
	// maxDelta is the most bytes an update of the round may take in the experiment's
	// encoding (round.Merger.MaxDeltaBytes; 0: no bound): a larger one is not fetched.
	maxDelta uint64
	merges   map[string]int // heads among the last replayWindow that merged each trainer: proven ones are served first at an epoch's tail
	// book says who holds, reported or is barred from the round's leases, and what to do
	// next (lease.Book): a peer that failed the round gets no further attempt in it.
	book *lease.Book
	// unbenched: quarantined trainers were leased to this round (too few others).
	unbenched bool
	// returns is, per trainer leased in the round, how often it had come back (restarted
	// or returned from silence, trainerSet.returns) when it was last leased: a change means
	// its lease is lost and it may be readmitted (lease.Book.Gone and Back).
	returns map[string]int
	// missed is, per trainer that let a lease of the round expire while it stayed (heard
	// from, the same process), the longest deadline it missed: its next lease gets at least
	// twice it (lease.Pace.Missed), unless it has come back since (missedBy).
	missed map[string]missedDeadline
	// started is when the leader took the round; rejected counts the contributions it
	// rejected and rejections names the first chain.MaxNoteEntries of them (for the round
	// notes).
	started    time.Time
	rejected   uint64
	rejections []chain.Rejection
	// order is the round's validator order (lease.Leaders) and rank this validator's place
	// in it; takenBy is a validator after it that leads the round too (grantHeard): this
	// one steps aside (standAside).
	order   []string
	rank    int
	takenBy string
	// foreign are the trainers that reported under another validator's lease of the round
	// (they were busy with its work): a lease of this validator they then miss is no strike.
	foreign map[string]bool
	// held are the contributions whose lease no grant heard so far names, with their
	// artifacts: their verdict waits for the round's end here (hold, settleHeld).
	held map[heldKey]string
	// fetches are the accepted contributions whose updates are on their way (fetches.go).
	fetches *deltaFetches
	// ref is the leader's reference window for the round (reference.go), nil without one.
	ref *referenceJob
}

// newOpenRound is the leader's state for the round after base; its fetches run under ctx
// until the caller stops them.
func newOpenRound(ctx context.Context, work *sync.WaitGroup, validators []string, self string, baseID cid.Cid, base *chain.Head, firstAttempt uint64) *openRound {
	r := &openRound{round: base.Round + 1, baseID: baseID, base: base, attempt: firstAttempt,
		received: map[string]received{}, book: lease.NewBook(base.Round+1, time.Now()), returns: map[string]int{},
		order: lease.Leaders(validators, baseID), foreign: map[string]bool{}, held: map[heldKey]string{},
		leases: map[cid.Cid]lease.Lease{}, missed: map[string]missedDeadline{}, fetches: newDeltaFetches(ctx, work)}
	r.rank = slices.Index(r.order, self)
	return r
}

type received struct {
	msg   *gossip.Contribution
	lease lease.Lease
	id    cid.Cid
	// fetch is how long this validator took to fetch the contribution's update.
	fetch time.Duration
}

// leadPhase runs one round as its leader: issuing (it waits until the round's book says
// what to do next, and grants an attempt's leases or closes the round), collecting (the
// attempt's contributions and releases, until every lease of it is settled or its
// deadline passes), proposing (it merges what it received), and standing aside when a
// later validator takes the round over (stepaside.go). It hands over to awaiting the
// quorum of the head it signed, or to leading the round again. firstAttempt separates the
// lease ids of a validator that took the round over from those of the leaders before it.
// Whatever way it ends, no verdict it held is left waiting and none of its fetches goes
// on.
type leadPhase struct {
	v            *validator
	baseID       cid.Cid
	base         *chain.Head
	firstAttempt uint64
	r            *openRound
	sub          string // PhaseIssuing, PhaseCollecting or PhaseStandingAside
	stopBeat     func()
	tick         *time.Ticker
	deadline     *time.Timer // the attempt's, while collecting
	// waitingSince is when issuing last logged that it waits for trainers.
	waitingSince time.Time
	aside        *aside // while standing aside
	// held are verdicts carried over from standing aside in this round (next.held).
	held map[heldKey]string
	// checking is since when checks of another validator's proposal of the round have held
	// the leases back (checks.holdBack).
	checking time.Time
}

func (p *leadPhase) begin(ctx context.Context, in *bus.Inbox) (*next, error) {
	v := p.v
	if l, locked := v.locks[p.base.Round+1]; locked {
		// Already signed a head for this round (as a follower): see it through.
		return awaiting(p.base.Round+1, l), nil
	}
	r := newOpenRound(ctx, &v.work, v.Validators, v.Self, p.baseID, p.base, p.firstAttempt)
	p.r = r
	if p.held != nil {
		r.held = p.held
	}
	r.book.MaxBackoff = min(lease.DefaultMaxBackoff, max(lease.DefaultBackoff, v.Config.Lease.RoundTimeout))
	r.merged, r.merges = v.recentMerges(p.baseID)
	r.maxDelta = v.Merger.MaxDeltaBytes(p.base)
	if cur, _ := v.Tips.Current(); !cur.Equals(p.baseID) {
		return nil, errHeadMoved // before the loop took changed: it would not fire for that move
	}
	r.started = time.Now()
	r.ref = v.startReference(ctx, r)
	// Until it proposes, the leader says it is alive every heartbeatEvery: while it waits
	// for a minimum group, for the backoff, for contributions or for its merge, the other
	// validators (a late-joining one too, which never saw its grant) must not take the
	// round over. The beats stop when the leader hands over or stands aside.
	p.stopBeat = v.heartbeat(ctx, r)
	p.tick = time.NewTicker(250 * time.Millisecond)
	p.issuing()
	return p.advance(ctx, in)
}

func (p *leadPhase) issuing() {
	p.sub = PhaseIssuing
	p.v.enter(PhaseIssuing, p.r.round)
	p.waitingSince = time.Now()
}

func (p *leadPhase) collecting() {
	p.sub = PhaseCollecting
	p.v.enter(PhaseCollecting, p.r.round)
	p.deadline = time.NewTimer(time.Until(p.r.deadline))
}

func (p *leadPhase) waits() waits {
	switch p.sub {
	case PhaseStandingAside:
		return waits{reads: readsAll, wake: p.aside.timer.C}
	case PhaseCollecting:
		return waits{reads: readsAll &^ readsAttestations, wake: p.deadline.C, tick: p.tick.C, fetched: p.r.fetches.done}
	}
	return waits{reads: readsAll &^ readsAttestations, tick: p.tick.C, fetched: p.r.fetches.done}
}

func (p *leadPhase) moved() *next { return startOver() }

func (p *leadPhase) end() {
	if p.stopBeat != nil {
		p.stopBeat()
	}
	for _, t := range []*time.Timer{p.deadline, p.aside.timerOrNil()} {
		if t != nil {
			t.Stop()
		}
	}
	if p.tick != nil {
		p.tick.Stop()
	}
	if p.r != nil {
		p.r.fetches.stop()
		p.v.settleHeld(p.r, true)
	}
}

func (p *leadPhase) on(ctx context.Context, in *bus.Inbox, ev event) (*next, error) {
	if p.sub == PhaseStandingAside {
		return p.onAside(ctx, in, ev)
	}
	v, r := p.v, p.r
	switch {
	case ev.head != nil:
		v.proposed(ctx, ev.head.From, ev.head.Msg)
	case ev.checked != nil:
		if n := v.verdict(ctx, *ev.checked, r.round); n != nil {
			return n, nil // it signed another validator's proposal of this round: it follows that one
		}
	case ev.contribution != nil:
		// Its lease may be another validator's, granted just now. (While issuing no lease
		// is outstanding: anything for this round is late, unleased or made under another
		// validator's lease.)
		v.drainGrants(r, in)
		v.accept(r, ev.contribution.From, ev.contribution.Msg)
	case ev.fetched != nil:
		v.fetchedDelta(r, *ev.fetched)
	case ev.leases != nil:
		v.grantHeard(r, *ev.leases)
	case ev.release != nil && p.sub == PhaseCollecting:
		v.release(r, ev.release.From, ev.release.Msg)
	case ev.wake && p.sub == PhaseCollecting:
		p.expired()
	}
	return p.advance(ctx, in)
}

// expired is the attempt's deadline, passed: the trainers that did not report are barred
// from the round and their microshards return to the pool; those whose updates are on
// their way keep their leases, and the round waits for them.
func (p *leadPhase) expired() {
	v, r := p.v, p.r
	v.expire(r)
	if len(r.fetches.pending) > 0 {
		// Contributions announced in time whose updates are still on their way keep their
		// leases: the round waits for them (each fetch is bounded by lease.round_timeout)
		// and closes once they are settled (advance).
		v.Log.Info("deadline passed with updates still arriving; waiting for them", "round", r.round,
			"arriving", len(r.fetches.pending), "received", len(r.received))
		return
	}
	r.book.End(time.Now())
	if len(r.received) < v.Config.Lease.MinGroup {
		v.Log.Warn("round deadline passed without the minimum group", "round", r.round, "received", len(r.received), "min_group", v.Config.Lease.MinGroup)
		v.Sink.Event("release", "round %d: deadline passed with %d of %d contributions", r.round, len(r.received), v.Config.Lease.MinGroup)
	}
	p.issuing()
}

// advance does what the round's state calls for after an event: collecting ends when
// every lease of the attempt is settled; issuing grants the next attempt, closes the round
// and proposes, or waits, as the round's book says. A leader that heard a later validator
// lead the round stands aside.
func (p *leadPhase) advance(ctx context.Context, in *bus.Inbox) (*next, error) {
	v, r := p.v, p.r
	for p.sub != PhaseStandingAside {
		v.noticeReturns(r, in)
		if r.takenBy != "" {
			p.standAside()
			return nil, nil
		}
		if p.sub == PhaseCollecting {
			if !r.book.Settled() {
				return nil, nil
			}
			r.book.End(time.Now())
			p.issuing()
			continue
		}
		st := p.nextStep()
		switch st.step {
		case lease.Close:
			if len(r.received) < v.Config.Lease.MinGroup && r.book.Attempts() > 1 {
				v.Log.Info("closing the round with fewer contributions than min_group: no other trainer to lease to",
					"round", r.round, "received", len(r.received), "min_group", v.Config.Lease.MinGroup, "barred", st.barred)
			}
			n, err := p.close(ctx, in)
			if n != nil || err != nil || p.sub == PhaseStandingAside {
				return n, err
			}
			p.issuing() // nothing survived screening: lease again
			continue
		case lease.Grant:
			if st.relaxed && !r.unbenched {
				r.unbenched = true
				q := len(v.quarantine.List(r.round))
				v.Log.Warn("too few trainers outside quarantine: leasing to quarantined peers this round", "round", r.round,
					"available", st.open, "quarantined", q, "min_group", v.Config.Lease.MinGroup)
				v.Sink.Event("quarantine", "round %d: too few trainers outside quarantine; leasing to the %d quarantined too", r.round, q)
			}
			if err := v.grant(ctx, r, st.avail, st.cands); err != nil {
				return nil, err
			}
			p.collecting()
			continue
		case lease.NewPass:
			why := barredReasons(r.book.Barred())
			if p.unreachable(why) {
				p.handOn()
				return nil, nil
			}
			v.Log.Warn("every live trainer failed this round and nothing was received: readmitting them", "round", r.round,
				"barred", st.barred, "reasons", why, "pass", r.book.Passes()+1)
			if r.book.Passes() > 0 && why == string(merge.ReasonLowCosine) {
				// Retries on one base tend to fail the same way: honest updates that the
				// cosine bar rejects pass after pass stall the run here.
				v.Log.Warn("every update of this round failed the cosine screen again: if these trainers are honest, "+
					"merge.screen.cosine_tolerance (or min_cosine) is too tight for this workload", "round", r.round, "pass", r.book.Passes()+1)
			}
			v.Sink.Event("release", "round %d: all %d live trainers failed the round; readmitting them (pass %d)", r.round, st.barred, r.book.Passes()+1)
			r.book.StartPass()
			r.ref = v.startReference(ctx, r) // a window of the pass's own (startReference)
			continue
		}
		if time.Since(p.waitingSince) > 10*time.Second {
			v.Log.Info("waiting for trainers", "round", r.round, "live", st.live, "candidates", len(st.cands), "barred", st.barred,
				"unreached", st.unreached, "behind", st.behind,
				"received", len(r.received), "min_group", v.Config.Lease.MinGroup)
			p.waitingSince = time.Now()
		}
		return nil, nil
	}
	return nil, nil
}

// close ends the round with what it received: it proposes the merge, unless a takeover
// or another validator's proposal of the round comes first. A nil next and no error with
// the leader still issuing means nothing survived screening.
func (p *leadPhase) close(ctx context.Context, in *bus.Inbox) (*next, error) {
	v, r := p.v, p.r
	locked, err := v.settleChecks(ctx, r.baseID, r.round)
	if err != nil {
		return nil, err
	}
	if locked {
		// Another validator's proposal of the round, checked meanwhile, was signed.
		return awaiting(r.round, v.locks[r.round]), nil
	}
	// A takeover that queued while this validator collected (or waited for a verdict
	// above) still comes before its proposal: two proposals of one round split the
	// validators' locks.
	v.drainGrants(r, in)
	if r.takenBy != "" {
		p.standAside()
		return nil, nil
	}
	v.settleHeld(r, true) // before the proposal: its notes count the rejections
	proposal, err := v.propose(ctx, r, time.Since(r.started))
	if err != nil || proposal == nil {
		return nil, err
	}
	return awaiting(r.round, *proposal), nil // the proposal, re-published, says the rest
}

// barredReasons lists the distinct reasons the round's trainers are barred for, sorted,
// comma-separated, for the log.
func barredReasons(barred map[string]string) string {
	return strings.Join(slices.Compact(slices.Sorted(maps.Values(barred))), ",")
}
