package validator

import (
	"context"
	"slices"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
)

// Failover timing (exported for the node's cluster tests): a follower expects leases
// within LeaseWait of a new head, and a proposal within LeaseGrace after the leases'
// deadline; the k-th validator in the order takes over (k-1) × TakeoverStep after that,
// so they do not all jump in at once.
//
// A leader that is heard but gets nowhere — cut off from every peer but one, its leases
// and heartbeats still arrive by gossip through that link while it cannot fetch a single
// contribution — keeps the silence timer from ever firing. So the validator that leads
// the round has stuckRounds round timeouts (lease.round_timeout) to bring a head to
// quorum; after that it is passed over like a silent one, in the same order. Each attempt
// of a leader lasts at most one round timeout, so a leader that works needs one, and two
// leave it a retry.
const (
	LeaseWait    = 3 * time.Second
	LeaseGrace   = time.Second
	TakeoverStep = time.Second
	stuckRounds  = 2
)

// followPhase is a validator's round when it is not the leader (following): it checks and
// attests proposals, and hands over to awaiting the quorum of the one it signed, or to
// leading the round when the validators ahead of it stay silent (a takeover).
type followPhase struct {
	v      *validator
	baseID cid.Cid
	base   *chain.Head
	r      uint64 // the round
	rank   int    // this validator's place in order
	order  []string
	ahead  []string // order[:rank]
	// expect is when a validator ahead must have shown progress by.
	expect time.Time
	// active is the rank of the validator ahead that leads the round now (a takeover
	// restarts the clock); stuckAt is when it will have had its stuckRounds round timeouts.
	active   int
	stuckAt  time.Time
	passOver bool
	// granted: the validator leading the round granted leases in it (not only heartbeats).
	granted bool
	// lastHeard is when the last grant or heartbeat of a validator ahead was read (zero:
	// none yet), for the takeover's log line: it tells a leader that fell silent from
	// beats that arrived late (a starved process).
	lastHeard time.Time
	timer     *time.Timer
	// deferred is since when checks of the round's proposals have held the takeover back
	// (checks.holdBack).
	deferred time.Time
}

func (p *followPhase) begin(context.Context, *bus.Inbox) (*next, error) {
	v := p.v
	p.r = p.base.Round + 1
	v.enter(PhaseFollowing, p.r)
	if l, locked := v.locks[p.r]; locked {
		return awaiting(p.r, l), nil
	}
	if cur, _ := v.Tips.Current(); !cur.Equals(p.baseID) {
		return nil, errHeadMoved // before the loop took changed: it would not fire for that move
	}
	p.ahead = p.order[:p.rank]
	p.expect = time.Now().Add(LeaseWait)
	if !v.signedByAll(p.baseID, p.ahead) {
		// A validator ahead has not signed the base here: it may still be recomputing the
		// base's merge, and it cannot lead before it has. This validator's own last merge
		// tells how long that takes (twice, for a slower machine); its attestation, when it
		// comes, restarts the clock (waiting).
		p.expect = p.expect.Add(min(2*v.mergeTook, v.Config.Lease.RoundTimeout))
	}
	p.stuckAt = time.Now().Add(stuckRounds * v.Config.Lease.RoundTimeout)
	p.passOver = v.canPassOverHeardLeader()
	p.timer = time.NewTimer(time.Until(p.takeoverAt()))
	return nil, nil
}

func (p *followPhase) silentAt() time.Time {
	return p.expect.Add(time.Duration(p.rank-1) * TakeoverStep)
}

func (p *followPhase) takeoverAt() time.Time {
	at := p.silentAt()
	if s := p.stuckAt.Add(time.Duration(p.rank-p.active-1) * TakeoverStep); p.passOver && s.Before(at) {
		at = s
	}
	return at
}

// reset sets the timer to the takeover time (it fires at once when that has passed).
func (p *followPhase) reset() { p.setTimer(time.Until(p.takeoverAt())) }

func (p *followPhase) setTimer(d time.Duration) {
	p.timer.Reset(d)
}

func (p *followPhase) waits() waits {
	return waits{reads: readsAll &^ readsReleases, wake: p.timer.C}
}

func (p *followPhase) moved() *next { return startOver() }

func (p *followPhase) end() {
	if p.timer != nil {
		p.timer.Stop()
	}
}

// heard takes in a grant or heartbeat of a validator ahead.
func (p *followPhase) heard(l bus.Received[gossip.Leases]) {
	v := p.v
	v.recordGrant(l)
	if l.Msg.Round != p.r || !slices.Equal(l.Msg.Base, p.baseID.Bytes()) || !slices.Contains(p.ahead, l.From) {
		return
	}
	p.lastHeard = time.Now()
	if k := slices.Index(p.order, l.From); k > p.active {
		// A validator ahead took the round over: it gets its own time.
		p.active, p.stuckAt, p.granted = k, time.Now().Add(stuckRounds*v.Config.Lease.RoundTimeout), false
		p.reset()
	}
	if len(l.Msg.Leases) > 0 && l.From == p.order[p.active] {
		p.granted = true
	}
	if d := time.UnixMilli(l.Msg.Deadline).Add(LeaseGrace); d.After(p.expect) {
		p.expect = d
		p.reset()
	}
}

// waiting takes in a validator ahead that has only now reached the base: it re-publishes
// the base's proposal (still gathering its quorum) or has just attested it. With a quorum
// of two, the first attester has the quorum one gossip hop before the proposer, and the
// proposer before the validators still recomputing the merge; under load each has taken
// seconds. The leader is not silent, it did not know yet: its time starts now.
func (p *followPhase) waiting() {
	p.lastHeard = time.Now()
	if d := time.Now().Add(LeaseWait); d.After(p.expect) {
		p.expect = d
		p.reset()
	}
}

// attested takes in an attestation: one of the base by a validator ahead means it has
// verified the base and can lead now.
func (p *followPhase) attested(a bus.Received[gossip.Attestation]) {
	if slices.Contains(p.ahead, a.From) && slices.Equal(a.Msg.Head, p.baseID.Bytes()) {
		p.waiting()
	}
}

// onHead takes in a head: the base re-published by a validator ahead, or a proposal for
// this round to check (checks.go).
func (p *followPhase) onHead(ctx context.Context, h bus.Received[gossip.Head]) {
	if baseStillOpen(h, p.baseID, p.ahead) {
		p.waiting()
		return
	}
	p.v.proposed(ctx, h.From, h.Msg)
}

func (p *followPhase) on(ctx context.Context, in *bus.Inbox, ev event) (*next, error) {
	v := p.v
	switch {
	case ev.announce != nil:
		if v.waitingForFleet(p.granted) {
			p.stuckAt = time.Now().Add(stuckRounds * v.Config.Lease.RoundTimeout)
		}
	case ev.contribution != nil:
		v.overheard(*ev.contribution, p.r)
	case ev.leases != nil:
		p.heard(*ev.leases)
	case ev.attestation != nil:
		p.attested(*ev.attestation)
	case ev.head != nil:
		p.onHead(ctx, *ev.head)
	case ev.checked != nil:
		return v.verdict(ctx, *ev.checked, p.r), nil
	case ev.wake:
		return p.due(ctx, in), nil
	}
	return nil, nil
}

// due is the takeover timer's firing: it takes the round over if the validators ahead are
// still silent (or stuck) once what queued meanwhile is read.
func (p *followPhase) due(ctx context.Context, in *bus.Inbox) *next {
	v := p.v
	// Grants, heartbeats, attestations and re-published proposals queued while the loop was
	// busy (starved of CPU) come first: a leader is silent only if nothing of it arrived,
	// not because nothing was read.
	for drained := false; !drained; {
		select {
		case l := <-in.Leases:
			p.heard(l)
		case a := <-in.Attestations:
			p.attested(a)
		case h := <-in.Heads:
			p.onHead(ctx, h)
		default:
			drained = true
		}
	}
	if v.checks.holdBack(p.r, &p.deferred, v.Config.Lease.RoundTimeout) {
		// A proposal of the round is being checked: no takeover before its verdict (the
		// timer looks again in LeaseGrace).
		p.setTimer(LeaseGrace)
		return nil
	}
	if time.Now().Before(p.takeoverAt()) {
		p.reset()
		return nil
	}
	if len(v.trainers.live()) == 0 {
		// Nothing to lead without trainers.
		p.expect = time.Now().Add(LeaseWait)
		if p.stuckAt.Before(p.expect) {
			p.stuckAt = p.expect
		}
		p.reset()
		return nil
	}
	if time.Now().Before(p.silentAt()) && v.waitingForFleet(p.granted) {
		p.stuckAt = time.Now().Add(stuckRounds * v.Config.Lease.RoundTimeout)
		p.reset()
		return nil
	}
	if time.Now().Before(p.silentAt()) {
		v.Log.Warn("the leader is heard but has brought no head to quorum; taking the round over", "round", p.r, "rank", p.rank,
			"leader", p.order[p.active], "waited", (stuckRounds * v.Config.Lease.RoundTimeout).String())
		v.Sink.Event("takeover", "round %d: %s was heard but brought no head to quorum in %d round timeouts; taking the round over (rank %d)",
			p.r, p.order[p.active], stuckRounds, p.rank)
	} else {
		lastAgo := "never"
		if !p.lastHeard.IsZero() {
			lastAgo = time.Since(p.lastHeard).Round(time.Millisecond).String()
		}
		v.Log.Warn("the validators ahead are silent; taking the round over", "round", p.r, "rank", p.rank, "leader", p.order[0],
			"last_heard_ago", lastAgo, "late_by", time.Since(p.silentAt()).Round(time.Millisecond).String())
		v.Sink.Event("takeover", "round %d: %s was silent; taking the round over (rank %d)", p.r, p.order[0], p.rank)
	}
	return leading(p.baseID, p.base, uint64(p.rank)<<16)
}

// signedByAll says whether every validator in vs has signed the head id as this validator
// holds it (its own signature and those gathered by gossip so far).
func (v *validator) signedByAll(id cid.Cid, vs []string) bool {
	sh, _, err := v.Heads.Get(id)
	if err != nil {
		return false
	}
	for _, p := range vs {
		if chain.FindSignature(sh.Sigs, p) == nil {
			return false
		}
	}
	return true
}

// baseStillOpen says whether h is the base's proposal re-published by a validator ahead:
// that validator has not seen the base reach its quorum yet (awaitingPhase re-publishes it
// with the signatures gathered so far; head sync sends this validator's attestation again
// when it is missing).
func baseStillOpen(h bus.Received[gossip.Head], baseID cid.Cid, ahead []string) bool {
	return slices.Contains(ahead, h.From) && h.Msg.Signed.ID().Equals(baseID)
}

// waitingForFleet says whether a heard leader that has granted nothing in the round is
// right to wait: this validator, too, hears fewer trainers than a minimum group, so no other
// leader could start the round either. Its stuck clock (stuckRounds round timeouts) then
// counts only from when enough trainers are heard.
func (v *validator) waitingForFleet(granted bool) bool {
	return !granted && len(v.trainers.live()) < v.Config.Lease.MinGroup
}

// canPassOverHeardLeader says whether a follower may take over from a leader that is still
// heard: only when the quorum is a majority (two heads of one round can then never both
// reach it, whoever proposes them) and the other validators can reach it without the
// leader. With two validators and quorum 2, say, a takeover could only leave both locked
// to their own proposals, and the round would never close.
func (v *validator) canPassOverHeardLeader() bool {
	n, q := len(v.Validators), v.Config.Experiment.Quorum
	return 2*q > n && n-1 >= q
}
