package validator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/round"
)

// Round timing of the leader.
const (
	republishEvery = 3 * time.Second // a proposal waiting for quorum is sent again
	replayWindow   = 64              // rounds back in which a merged delta counts as a replay
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
	merges   map[string]int   // heads among the last replayWindow that merged each trainer: proven ones are served first at an epoch's tail
	// book says who holds, reported or is barred from the round's leases, and what to do
	// next (lease.Book): a peer that failed the round gets no further attempt in it.
	book *lease.Book
	// unbenched: quarantined trainers were leased to this round (too few others).
	unbenched bool
	// returns is, per trainer leased in the round, how often it had come back (restarted
	// or returned from silence, trainerSet.returns) when it was last leased: a change means
	// its lease is lost and it may be readmitted (lease.Book.Gone and Back).
	returns map[string]int
	// blind counts the round's attempts leased with no trainer pace known that expired
	// with nothing received: each doubles the next blind deadline (lease.Timing.Blind).
	blind      int
	blindGrant bool // the current attempt was leased with no pace known
	atGrant    int  // contributions received when the current attempt was leased
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
		leases: map[cid.Cid]lease.Lease{}, fetches: newDeltaFetches(ctx, work)}
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
	if r.blindGrant && len(r.received) == r.atGrant && len(r.fetches.pending) == 0 {
		r.blind++ // the first-deadline guess was too short for this workload
	}
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
			continue
		}
		if time.Since(p.waitingSince) > 10*time.Second {
			v.Log.Info("waiting for trainers", "round", r.round, "live", st.live, "candidates", len(st.cands), "barred", st.barred,
				"received", len(r.received), "min_group", v.Config.Lease.MinGroup)
			p.waitingSince = time.Now()
		}
		return nil, nil
	}
	return nil, nil
}

// issueStep is what the round's book says to do now (step), with the microshards available,
// the trainers that may be leased (relaxed: quarantined ones among them, too few others),
// and how many trainers are live, open to a lease and barred from the round.
type issueStep struct {
	step               lease.Step
	avail              []uint32
	cands              []lease.Trainer
	live, open, barred int
	relaxed            bool
}

func (p *leadPhase) nextStep() issueStep {
	v, r := p.v, p.r
	taken := r.ofUpdates(func(rc received) []uint32 { return rc.msg.Microshards })
	reserved := r.reservedNow()
	var st issueStep
	for _, s := range lease.Available(r.base.Ledger) {
		if !taken[s] && !reserved[s] {
			st.avail = append(st.avail, s)
		}
	}
	live := v.trainers.live()
	barred := r.book.Barred()
	for i, t := range live {
		live[i].Proven = r.merges[t.Peer] > 0
		if barred[t.Peer] != "" {
			st.barred++
		}
	}
	open := r.book.Candidates(live)
	st.live, st.open = len(live), len(open)
	st.cands, st.relaxed = v.quarantine.Eligible(open, r.round, len(r.received), v.Config.Lease.MinGroup)
	if r.book.Lone() {
		st.cands = lease.OneOf(st.cands)
	}
	// A (re)started leader leases nothing before it has heard the fleet announce, nor while
	// it checks another validator's proposal of the round (it follows that one if it
	// passes: its trainers' work on new leases would be lost), for one recomputation's
	// bound at most (checks.holdBack).
	st.step = lease.Wait
	checking := v.checks.holdBack(r.round, &p.checking, v.Config.Lease.RoundTimeout)
	if time.Since(v.started) > gossip.AnnounceEvery+250*time.Millisecond && !checking {
		st.step = r.book.Next(time.Now(), lease.Situation{Received: len(r.received), MinGroup: v.Config.Lease.MinGroup,
			Candidates: len(st.cands), Barred: st.barred, Available: len(st.avail), Patience: max(r.window, v.Config.Lease.MinDeadline)})
	}
	if st.step == lease.Grant && v.joining(r) {
		st.step = lease.Wait
	}
	return st
}

// joinGrace is how long a young chain's leader waits, before its round's first grant,
// after the last trainer it heard for the first time: trainers started together are heard
// one by one, each within an announcement period of its start, and a round leased to the
// first one heard is trained by that one alone (the opening one attacker started first
// took, issue 42). joinWaitMax bounds the wait of one round.
const (
	joinGrace   = gossip.AnnounceEvery + 250*time.Millisecond
	joinWaitMax = 2 * joinGrace
)

// joining says whether the round's first grant waits for trainers still joining: in a
// young chain (the first trustMerges rounds), while a trainer was first heard within
// joinGrace, until joinWaitMax after the first live trainer was heard at most.
func (v *validator) joining(r *openRound) bool {
	if r.granted || r.round > trustMerges {
		return false
	}
	first, last := v.trainers.joined()
	return !last.IsZero() && time.Since(last) < joinGrace && time.Since(first) < joinWaitMax
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

func (v *validator) recentMerges(from cid.Cid) (map[cid.Cid]bool, map[string]int) {
	return RecentMerges(v.Heads, from)
}

// RecentMerges returns the delta artifacts merged in the last replayWindow heads from
// from, and for each peer the number of those heads that merged a contribution of it: what
// the leader's grant and screening read of the chain (a peer with fewer than trustMerges is
// on probation).
func RecentMerges(heads *chain.Store, from cid.Cid) (map[cid.Cid]bool, map[string]int) {
	out, merges := map[cid.Cid]bool{}, map[string]int{}
	n := 0
	_ = heads.Walk(from, func(_ cid.Cid, h *chain.Head) error {
		for _, c := range h.Contributions {
			if id, err := cid.Cast(c.Artifact); err == nil {
				out[id] = true
			}
			merges[c.Peer]++
		}
		if n++; n >= replayWindow {
			return chain.StopWalk
		}
		return nil
	})
	return out, merges
}

// trustMerges is how many of the last replayWindow heads must have merged a peer's
// contributions for its next one to be screened without probation: as many as the rounds
// screening needs to warm up, so that honest peers merged from the first round are trusted
// by the time the calibrated bars take over. New peers, peers back from quarantine (whose
// rejected updates were never merged) and peers away for replayWindow rounds are held to
// the screening floor until then (merge.Screening.SetProbation). Every validator counts
// the same heads, so the verdicts agree.
const trustMerges = merge.HistoryWarmup

// OnProbation says whether a peer with these recent merges is on probation.
func OnProbation(merges map[string]int, peer string) bool { return merges[peer] < trustMerges }

// Sole says whether peer is the only one these recent merges name: the swarm has had one
// trainer (one node's run), and a round of its update alone is not judged by direction
// (round.Candidate.Sole). Every validator counts the same heads, so the verdicts agree.
func Sole(merges map[string]int, peer string) bool { return len(merges) == 1 && merges[peer] > 0 }

// heartbeat publishes, every heartbeatEvery until stop is called, an empty grant of the
// round with a deadline 2 × heartbeatEvery ahead: a follower that hears it expects the
// leader's next sign of life by then (plus LeaseGrace), so it does not take the round over
// from a leader that waits (for a minimum group, a backoff, contributions) or merges. The
// deadline moves with every beat, so no two beats are the same message (gossip drops a
// repeat). Trainers ignore a grant without a lease for them.
func (v *validator) heartbeat(ctx context.Context, r *openRound) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	round, base, first := r.round, r.baseID.Bytes(), r.attempt
	go func() {
		defer close(done)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			hb := &gossip.Leases{Experiment: v.Config.Experiment.ID, Round: round, Base: base, Issuer: v.Self,
				Deadline: time.Now().Add(2 * heartbeatEvery).UnixMilli(), Attempt: first}
			if err := v.Bus.Publish(ctx, hb); err != nil && ctx.Err() == nil {
				v.Log.Debug("publish heartbeat", "round", round, "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

func (v *validator) grant(ctx context.Context, r *openRound, avail []uint32, cands []lease.Trainer) error {
	if r.granted {
		r.attempt++
	}
	r.granted = true
	// The data order depends on the model state (its parameters) and the attempt, not on the
	// head's id, whose lease records carry wall-clock expiries: equal models get equal leases.
	seed := append(slices.Clone(r.base.Params), byte(r.base.Round), byte(r.base.Round>>8), byte(r.attempt), byte(r.attempt>>8))
	work := WorkCandidates(cands, v.Config.Protocol.SpeedProportional)
	// The round's proposal lists every received contribution's microshards: a later attempt
	// leases only what is left of the round's bound, so the proposal fits its message.
	budget := lease.MaxRoundMicroshards
	for _, rc := range r.received {
		budget -= len(rc.msg.Microshards) + len(rc.lease.Next)
	}
	// A trainer's share holds a window's samples where the epoch allows it, so a window does
	// not loop over its examples (window.go).
	share := v.windowShare(len(work))
	// Trainers that trained their reservation ahead get it (overlap.go); the others share
	// what is left.
	plan, steps, rest, others := honour(v.reservations(r), avail, work, budget)
	for _, ms := range plan {
		budget -= len(ms)
	}
	fresh := lease.AssignWithin(rest, others, share, budget, seed)
	// An epoch's tail leaves some trainers short of microshards: their windows shrink with
	// their data, so they neither repeat it nor outweigh it.
	freshSteps := lease.TailSteps(lease.Steps(others, v.Config.Protocol.InnerSteps), fresh, others, share)
	for p, ms := range fresh {
		plan[p], steps[p] = ms, freshSteps[p]
		budget -= len(ms)
	}
	var next map[string][]uint32
	var nextSteps map[string]int
	// No reservation for a round after the experiment's last.
	if v.Config.Protocol.Overlap == config.OverlapEager && !v.Config.Experiment.RoundLimitReached(r.round) {
		next, nextSteps = reserve(r.nextPool(avail, plan), plan, work, share, budget, v.Config.Protocol.InnerSteps, seed)
	}
	peers := make([]string, 0, len(plan))
	for p := range plan {
		peers = append(peers, p)
	}
	sort.Strings(peers)
	var pace []lease.Pace
	for _, p := range peers {
		pace = append(pace, lease.Pace{Peer: p, SecondsPerStep: v.paces.get(p), Announced: v.trainers.stepSeconds(p), Steps: steps[p]})
		r.returns[p] = v.trainers.returns(p)
	}
	r.window = lease.Deadline(pace, lease.Timing{Floor: v.Config.Lease.MinDeadline, Ceiling: v.Config.Lease.RoundTimeout,
		Unknown: v.Config.Lease.FirstDeadline, Blind: r.blind})
	r.blindGrant, r.atGrant = !lease.PaceKnown(pace), len(r.received)
	r.deadline = time.Now().Add(r.window)
	msg := &gossip.Leases{Experiment: v.Config.Experiment.ID, Round: r.round, Base: r.baseID.Bytes(), Issuer: v.Self,
		Deadline: r.deadline.UnixMilli(), Attempt: r.attempt}
	r.leases = map[cid.Cid]lease.Lease{}
	leased := map[string]int{}
	for _, p := range peers {
		l := lease.Lease{Round: r.round, Base: r.baseID.Bytes(), Trainer: p, Microshards: plan[p],
			Expiry: r.deadline.UnixMilli(), Issuer: v.Self, Epoch: r.base.Ledger.Epoch, Steps: uint32(steps[p])}
		if ns := next[p]; len(ns) > 0 {
			l.Next, l.NextSteps = ns, uint32(nextSteps[p])
		}
		r.leases[l.ID()] = l
		r.all = append(r.all, l)
		msg.Leases = append(msg.Leases, l)
		leased[p] = len(l.Microshards)
	}
	r.book.Grant(msg.Leases)
	// Its own leases too: should it step aside and lead the round again, a contribution
	// under one of them is late, not unknown.
	v.grants.record(v.Self, msg)
	v.Sink.Status(func(vs *Status) {
		*vs = Status{Phase: vs.Phase, Round: r.round, Attempt: r.attempt, Leased: leased, Deadline: r.deadline, Trainers: len(cands),
			Quarantined: v.quarantine.List(r.round), Barred: r.book.Barred(), Rejections: vs.Rejections, Recent: vs.Recent}
	})
	v.Log.Info("issued leases", "round", r.round, "attempt", r.attempt, "trainers", len(peers), "deadline", time.Until(r.deadline).Round(time.Millisecond).String())
	return v.Bus.Publish(ctx, msg)
}

// expire bars the trainers that did not report by the deadline: their microshards go back
// to the pool, and repeated misses count toward quarantine.
func (v *validator) expire(r *openRound) {
	arriving := func(p string) bool { _, ok := r.fetches.pending[p]; return ok }
	for _, p := range r.book.ExpireExcept(arriving) {
		n := 0
		for _, l := range r.leases {
			if l.Trainer == p {
				n = len(l.Microshards)
			}
		}
		v.Sink.LeaseEnded("expired")
		v.Log.Warn("trainer did not report by the deadline; its microshards return to the pool", "round", r.round, "peer", p, "microshards", n)
		v.Sink.Event("missing", "round %d: %s did not report by the deadline; its %d microshards return to the pool", r.round, p, n)
		if r.foreign[p] || v.staleForeign(r, p) {
			// It trained another validator's lease of this round, or of the round before
			// whose head could not merge it, first (two validators led it): not its fault.
			continue
		}
		v.missed(p, r.round, "expired")
	}
	v.Sink.Status(func(vs *Status) { vs.Barred = r.book.Barred() })
}

// noticeReturns settles the lease of a trainer of the round that left — it restarted (it
// announced a new process start) or fell silent for longer than gossip.LiveFor — so its
// microshards go back to the pool at once, and readmits it once it is heard from again, if
// the round's book allows (lease.Book.Back: only after leaving or an expired lease, at
// most Returns times a round).
func (v *validator) noticeReturns(r *openRound, in *bus.Inbox) {
	// Announcements queued while the loop was busy (merging, say) come first: a trainer
	// is silent only if nothing of it arrived, not because nothing was read.
	for drained := false; !drained; {
		select {
		case a := <-in.Announces:
			v.trainers.seen(a.From, a.Msg)
		default:
			drained = true
		}
	}
	for p, n := range r.returns {
		now := v.trainers.returns(p)
		back := now != n
		left := back || !v.trainers.isLive(p) && v.holdsLease(r, p)
		r.returns[p] = now
		if left && r.book.Gone(p) {
			why := "fell silent"
			if back {
				why = v.trainers.returnedHow(p)
			}
			v.Sink.LeaseEnded(lease.ReasonGone)
			v.Log.Warn("trainer left while holding its lease; its microshards return to the pool", "round", r.round, "peer", p, "how", why)
			v.Sink.Event("release", "round %d: %s %s while holding its lease; its microshards return to the pool", r.round, p, why)
			v.missed(p, r.round, lease.ReasonGone)
			v.Sink.Status(func(vs *Status) { vs.Barred = r.book.Barred() })
		}
		if back && r.book.Back(p) {
			v.Log.Info("trainer is back: it may be leased again in this round", "round", r.round, "peer", p)
			v.Sink.Event("release", "round %d: %s is back; it may be leased again this round", r.round, p)
			v.Sink.Status(func(vs *Status) { vs.Barred = r.book.Barred() })
		}
	}
}

// holdsLease reports whether p holds an unsettled lease of the current attempt.
func (v *validator) holdsLease(r *openRound, p string) bool {
	for id, l := range r.leases {
		if l.Trainer == p && r.book.Holds(p, id) {
			return true
		}
	}
	return false
}

// release takes back a lease its trainer gave up (its worker failed): the trainer gets no
// further attempt in the round, and the lease's microshards return to the pool at once.
func (v *validator) release(r *openRound, from string, m *gossip.Release) {
	id, err := cid.Cast(m.Lease)
	if err != nil || m.Round != r.round || !slices.Equal(m.Base, r.baseID.Bytes()) || !r.book.Holds(from, id) {
		return // not a lease of the open attempt held by its sender: nothing to take back
	}
	r.book.Bar(from, "released")
	v.Sink.LeaseEnded("released")
	v.Log.Warn("trainer released its lease; its microshards return to the pool", "round", r.round, "peer", from,
		"lease", id.String(), "reason", m.Reason)
	v.Sink.Event("release", "round %d: %s gave its lease back (%s)", r.round, from, m.Reason)
	v.missed(from, r.round, "released")
	v.Sink.Status(func(vs *Status) { vs.Barred = r.book.Barred() })
}

// missed counts a lease that came to nothing toward the trainer's quarantine.
func (v *validator) missed(peer string, round uint64, why string) {
	if v.quarantine.Miss(peer, round) {
		v.Log.Warn("peer quarantined: no leases for a while", "peer", peer, "rounds", v.Config.Lease.QuarantineRounds, "reason", why)
		v.Sink.Event("quarantine", "%s quarantined for %d rounds after repeated missed leases (%s)", peer, v.Config.Lease.QuarantineRounds, why)
		v.Sink.Status(func(vs *Status) { vs.Quarantined = v.quarantine.List(round) })
	}
}

// accept checks a contribution against the leases of the open round and starts fetching
// its delta (fetchedDelta finishes the acceptance).
// A leased trainer whose contribution is rejected gets no further attempt in the round.
func (v *validator) accept(r *openRound, from string, c *gossip.Contribution) {
	delta := c.Delta
	reject := func(bar bool, reason, format string, args ...any) {
		v.rejectContribution(r, from, delta, bar, reason, format, args...)
	}
	if c.Round != r.round || !slices.Equal(c.Base, r.baseID.Bytes()) {
		if c.Round < r.round {
			// Late for a closed round: nothing to judge, but it may tell why its trainer
			// misses its lease of this one (staleForeign).
			v.noteReport(from, c, r.round)
			return
		}
		// A trainer leased in this round that reports on another base has failed its lease:
		// barred, its microshards go back to the pool now rather than at the deadline.
		_, reported := r.received[from]
		reject(c.Round == r.round && !reported, "wrong_base", "for round %d on another base, open round is %d", c.Round, r.round)
		return
	}
	if c.Peer != from {
		reject(false, "forged_peer", "message from %s claims peer %s", from, c.Peer)
		return
	}
	leaseID, err := cid.Cast(c.Lease)
	if err != nil {
		reject(true, "no_lease", "lease id: %v", err)
		return
	}
	if _, dup := r.received[from]; dup || r.fetches.pending[from].delta.Defined() {
		reject(false, "replay", "second contribution for round %d", r.round)
		return
	}
	l, ok := r.leases[leaseID]
	if !ok || l.Trainer != from || !r.book.Holds(from, leaseID) {
		issuer := v.grants.issuer(r.round, r.baseID, leaseID, from)
		switch {
		case slices.ContainsFunc(r.all, func(x lease.Lease) bool { return x.ID().Equals(leaseID) && x.Trainer == from }):
			reject(false, "late", "lease %s expired or was settled with an earlier attempt", leaseID)
		case issuer == v.Self:
			// This validator granted it when it led the round before it stepped aside.
			reject(false, "late", "lease %s was granted by this validator before it stepped aside in round %d", leaseID, r.round)
		case issuer != "":
			// Another validator leads (or led) this round too, and the trainer worked for it:
			// no strike, and it may still report on its lease of this validator. Its update
			// cannot be merged here: a proposal lists only the proposer's leases.
			r.foreign[from] = true
			reject(false, ReasonForeignLease, "lease %s was granted by %s, another validator leading round %d",
				leaseID, issuer, r.round)
		default:
			// Maybe another validator's lease whose grant has not reached this one yet.
			art := ""
			if id, err := cid.Cast(delta); err == nil {
				art = id.String()
			}
			if !v.hold(r, from, leaseID, art) {
				reject(true, "no_lease", "lease %s was not granted to %s", leaseID, from)
			}
		}
		return
	}
	if !slices.Equal(l.Microshards, c.Microshards) {
		reject(true, "lease_mismatch", "microshards differ from the lease")
		return
	}
	deltaID, err := cid.Cast(c.Delta)
	if err != nil {
		reject(true, "malformed", "delta id: %v", err)
		return
	}
	if r.merged[deltaID] {
		reject(true, "replay", "delta %s was merged in an earlier round", deltaID)
		return
	}
	// A free rider announces another trainer's delta of this round as its own: the artifact
	// is credited once, to whoever announced it first (the copier can only copy what it has
	// already seen announced).
	for p, rc := range r.received {
		if slices.Equal(rc.msg.Delta, c.Delta) {
			reject(true, "copy", "delta %s was already announced by %s in this round", deltaID, p)
			return
		}
	}
	for p, f := range r.fetches.pending {
		if f.delta.Equals(deltaID) {
			reject(true, "copy", "delta %s was already announced by %s in this round", deltaID, p)
			return
		}
	}
	hint, _ := peer.Decode(from)
	// The deadline is for announcing: an update announced in time may take what the
	// trainer's uplink takes (a 68 MB fp32 update is 27 s at 20 Mbit/s), up to
	// lease.round_timeout, and the artifact layer gives up on a holder that stalls.
	r.fetches.start(v.Bus, from, received{msg: c, lease: l, id: leaseID}, deltaID, hint, time.Now().Add(v.Config.Lease.RoundTimeout))
}

// rejectContribution rejects from's contribution (update artifact delta) to round r for
// reason, barring it from the round's further attempts when bar is set.
func (v *validator) rejectContribution(r *openRound, from string, delta []byte, bar bool, reason, format string, args ...any) {
	art := ""
	if id, err := cid.Cast(delta); err == nil {
		art = id.String()
	}
	v.rejected(from, r.round, reason, fmt.Sprintf(format, args...), art)
	r.reject(from, reason)
	if bar && r.book.Bar(from, reason) {
		v.Sink.Status(func(vs *Status) { vs.Barred = r.book.Barred() })
	}
}

// noteSpeed takes a trainer's current speed from its contribution (trainerSet.measured):
// the leader from those it accepts, a follower from every contribution its author sent, so
// whichever validator leads the next round sizes its leases by it. steps is the lease's
// inner steps (0 where this validator does not know the lease).
func (v *validator) noteSpeed(from string, c *gossip.Contribution, steps int) {
	if c.Peer != from {
		return
	}
	train := c.TrainSeconds
	if train == 0 {
		train = c.Seconds // a trainer that does not report the split
	}
	v.trainers.measured(from, c.Samples, train, steps)
}

// propose merges what was received and publishes the proposal (nil: nothing survived
// screening, lease again).
func (v *validator) propose(ctx context.Context, r *openRound, took time.Duration) (*lockedHead, error) {
	v.enter(PhaseProposing, r.round)
	cands := make([]round.Candidate, 0, len(r.received))
	var wire []gossip.Candidate
	for p, rc := range r.received {
		delta, _ := cid.Cast(rc.msg.Delta)
		cands = append(cands, round.Candidate{Peer: p, Delta: delta, Lease: rc.id, Samples: rc.msg.Samples,
			Microshards: rc.msg.Microshards, Loss: rc.msg.Loss, Probation: OnProbation(r.merges, p),
			Sole: Sole(r.merges, p)})
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].Peer < cands[j].Peer })
	var leases []lease.Lease
	for _, c := range cands {
		wire = append(wire, gossip.Candidate{Peer: c.Peer, Delta: c.Delta.Bytes(), Lease: c.Lease.Bytes(), Samples: c.Samples,
			Microshards: c.Microshards, Loss: c.Loss})
		leases = append(leases, r.received[c.Peer].lease)
	}
	refID, err := v.reference(ctx, r)
	if err != nil {
		return nil, err
	}
	mergeStart := time.Now()
	out, err := v.Merger.MergeWith(ctx, r.baseID, r.base, cands, refID)
	v.mergeTook = time.Since(mergeStart)
	rejected := map[string]string{}
	if out != nil {
		for _, rj := range out.Rejected {
			art := ""
			if rc, ok := r.received[rj.Peer]; ok {
				if id, err := cid.Cast(rc.msg.Delta); err == nil {
					art = id.String()
				}
			}
			v.rejected(rj.Peer, r.round, rj.Reason, rj.Detail, art)
			r.reject(rj.Peer, rj.Reason)
			rejected[rj.Peer] = rj.Reason
			delete(r.received, rj.Peer)
			// Its microshards return to the pool, for other trainers: a rejected peer gets
			// no second attempt in the round.
			r.book.Bar(rj.Peer, rj.Reason)
		}
	}
	v.Sink.Status(func(vs *Status) {
		vs.Rejected, vs.Barred = rejected, r.book.Barred()
	})
	if errors.Is(err, round.ErrNothingMerged) {
		r.book.Discard(time.Now())
		if disagreed(rejected) && !r.book.Lone() {
			r.book.Disagreed()
			v.Log.Warn("the round's updates point away from each other and nothing else can tell which is right: "+
				"leasing one trainer at a time for the rest of the round", "round", r.round, "rejected", len(rejected))
			v.Sink.Event("release", "round %d: %d updates disagree with each other; leasing one trainer at a time", r.round, len(rejected))
		}
		v.Sink.Event("release", "round %d: no contribution passed screening; leasing again", r.round)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sh, err := v.sign(out.Head)
	if err != nil {
		return nil, err
	}
	mergeTook := time.Since(mergeStart)
	notes := r.notes(mergeTook)
	notes.Quarantined = quarantineNotes(v.quarantine.List(r.round))
	if v.final(r.round) {
		// Nothing waits for the last head: it goes out with its metrics, after the
		// heads before it have theirs (heldout.go).
		v.evaluated()
		notes.HeldOut = v.evaluate(ctx, out.Head)
		notes.HeldOutFailed = notes.HeldOut == nil && v.evalDue(out.Head) && ctx.Err() == nil
	}
	// The head is evaluated once it is out (heldout.go); its place with the evaluator is
	// taken before it becomes canonical here, and its notes say the metrics will follow.
	later := !v.final(r.round) && v.reserve(ctx, out.Head)
	handed := false
	defer func() {
		if later && !handed {
			v.heldOut.release()
		}
	}()
	notes.HeldOutDue = later
	notes.Seconds = time.Since(r.started).Seconds()
	if err := v.signNotes(out.ID, out.Head.Round, notes); err != nil {
		return nil, err
	}
	msg := &gossip.Head{Experiment: v.Config.Experiment.ID, Signed: *sh, Notes: notes,
		Proposal: &gossip.Proposal{Attempt: r.attempt, Leases: leases, Candidates: wire, Reference: refBytes(refID)},
		Earlier:  v.earlierNotes(out.Head)}
	lk := lockedHead{id: out.ID, msg: msg}
	if err := v.lock(r.round, lk); err != nil {
		return nil, err
	}
	if _, err := v.Tips.Offer(sh); err != nil {
		return nil, err
	}
	v.Sink.RoundClosed(took, len(out.Head.Contributions), notes)
	logArgs := []any{"round", r.round, "head", out.ID.String(), "merged", len(out.Head.Contributions),
		"rejected", len(out.Rejected), "took", took.Round(time.Millisecond).String(), "screened", out.Screened}
	if refID.Defined() {
		logArgs = append(logArgs, "reference_seconds", r.ref.took.Seconds())
	}
	v.Log.Info("proposed head", logArgs...)
	if err := v.Bus.Publish(ctx, msg); err != nil {
		return nil, fmt.Errorf("publish proposal: %w", err)
	}
	if later {
		v.evaluateLater(heldOutJob{id: out.ID, head: out.Head, notes: *notes, msg: *msg})
		handed = true
	}
	return &lk, nil
}

// refBytes is a reference artifact as a proposal names it (nil for none).
func refBytes(id cid.Cid) []byte {
	if !id.Defined() {
		return nil
	}
	return id.Bytes()
}

// notes are the round's time split as its leader saw it, for the merged contributions
// (those still in received): the slowest trainer's inner steps, the longest transfer path
// (a trainer's fetch of the base parameters and microshards, then this validator's fetch of
// its update), and merge (screening, aggregation, signing).
func (r *openRound) notes(merge time.Duration) *chain.Notes {
	n := &chain.Notes{Round: r.round, Rejected: r.rejected, Rejections: r.rejections, MergeSeconds: merge.Seconds()}
	for _, rc := range r.received {
		train := rc.msg.TrainSeconds
		if train == 0 {
			train = rc.msg.Seconds // a trainer that does not report the split
		}
		n.TrainSeconds = max(n.TrainSeconds, train)
		n.CommSeconds = max(n.CommSeconds, rc.msg.FetchSeconds+rc.fetch.Seconds())
	}
	return n
}

// reject counts a rejected contribution of peer to the round, for the round notes.
func (r *openRound) reject(peer, reason string) {
	r.rejected++
	if len(r.rejections) < chain.MaxNoteEntries {
		r.rejections = append(r.rejections, chain.Rejection{Peer: peer, Reason: reason})
	}
}

// quarantineNotes is a quarantine list (lease.Quarantine.List) as round notes carry it:
// sorted by peer, at most chain.MaxNoteEntries.
func quarantineNotes(list map[string]uint64) []chain.Quarantine {
	var out []chain.Quarantine
	for _, p := range slices.Sorted(maps.Keys(list)) {
		if len(out) == chain.MaxNoteEntries {
			break
		}
		out = append(out, chain.Quarantine{Peer: p, Until: list[p]})
	}
	return out
}

// WorkCandidates are the trainers as lease sizing sees them: with speed-proportional work
// their measured capacities, otherwise all alike (capacity unknown counts as average), so
// every trainer gets inner_steps and the same share of microshards (windowShare).
func WorkCandidates(cands []lease.Trainer, proportional bool) []lease.Trainer {
	if proportional {
		return cands
	}
	out := slices.Clone(cands)
	for i := range out {
		out[i].Capacity = 0
	}
	return out
}

// disagreed reports whether a closing that merged nothing rejected two or more updates for
// their direction: they were held to each other (a young chain's pair) and every retry on
// the base would be too (lease.Book.Disagreed).
func disagreed(rejected map[string]string) bool {
	n := 0
	for _, why := range rejected {
		if why == string(merge.ReasonLowCosine) {
			n++
		}
	}
	return n >= 2
}

// barredReasons lists the distinct reasons the round's trainers are barred for, sorted,
// comma-separated, for the log.
func barredReasons(barred map[string]string) string {
	return strings.Join(slices.Compact(slices.Sorted(maps.Values(barred))), ",")
}
