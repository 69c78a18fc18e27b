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

// errLocked means this validator signed another validator's proposal for the round it was
// leading: it follows that proposal instead of making its own.
var errLocked = errors.New("signed another proposal for this round")

// follow is a validator's round when it is not the leader: it checks and attests
// proposals, and hands over to awaiting the quorum of the one it signed, or to leading the
// round when the validators ahead of it stay silent (a takeover).
func (v *validator) follow(ctx context.Context, in *bus.Inbox, baseID cid.Cid, base *chain.Head, rank int, order []string) (next, error) {
	v.enter(PhaseFollowing, base.Round+1)
	r := base.Round + 1
	if l, locked := v.locks[r]; locked {
		return awaiting(r, l), nil
	}
	changed := v.Tips.Changed()
	if cur, _ := v.Tips.Current(); !cur.Equals(baseID) {
		return next{}, errHeadMoved // before changed was taken: it would not fire for that move
	}
	expect := time.Now().Add(LeaseWait) // when a validator ahead must have shown progress by
	if !v.signedByAll(baseID, order[:rank]) {
		// A validator ahead has not signed the base here: it may still be recomputing the
		// base's merge, and it cannot lead before it has. This validator's own last merge
		// tells how long that takes (twice, for a slower machine); its attestation, when it
		// comes, restarts the clock (waiting).
		expect = expect.Add(min(2*v.mergeTook, v.Config.Lease.RoundTimeout))
	}
	silentAt := func() time.Time { return expect.Add(time.Duration(rank-1) * TakeoverStep) }
	// active is the rank of the validator ahead that leads the round now (a takeover
	// restarts the clock); stuckAt is when it will have had its stuckRounds round timeouts.
	active, stuckAt := 0, time.Now().Add(stuckRounds*v.Config.Lease.RoundTimeout)
	passOver := v.canPassOverHeardLeader()
	takeoverAt := func() time.Time {
		at := silentAt()
		if s := stuckAt.Add(time.Duration(rank-active-1) * TakeoverStep); passOver && s.Before(at) {
			at = s
		}
		return at
	}
	timer := time.NewTimer(time.Until(takeoverAt()))
	defer timer.Stop()
	reset := func() {
		timer.Stop()
		timer = time.NewTimer(time.Until(takeoverAt()))
	}
	ahead := order[:rank]
	// granted: the validator leading the round granted leases in it (not only heartbeats).
	granted := false
	// lastHeard is when the last grant or heartbeat of a validator ahead was read (zero:
	// none yet), for the takeover's log line: it tells a leader that fell silent from
	// beats that arrived late (a starved process).
	var lastHeard time.Time
	// heard takes in a grant or heartbeat of a validator ahead.
	heard := func(l bus.Received[gossip.Leases]) {
		v.recordGrant(l)
		if l.Msg.Round != r || !slices.Equal(l.Msg.Base, baseID.Bytes()) || !slices.Contains(ahead, l.From) {
			return
		}
		lastHeard = time.Now()
		if k := slices.Index(order, l.From); k > active {
			// A validator ahead took the round over: it gets its own time.
			active, stuckAt, granted = k, time.Now().Add(stuckRounds*v.Config.Lease.RoundTimeout), false
			reset()
		}
		if len(l.Msg.Leases) > 0 && l.From == order[active] {
			granted = true
		}
		if d := time.UnixMilli(l.Msg.Deadline).Add(LeaseGrace); d.After(expect) {
			expect = d
			reset()
		}
	}
	// waiting takes in a validator ahead that has only now reached the base: it re-publishes
	// the base's proposal (still gathering its quorum) or has just attested it. With a
	// quorum of two, the first attester has the quorum one gossip hop before the proposer,
	// and the proposer before the validators still recomputing the merge; under load each
	// has taken seconds. The leader is not silent, it did not know yet: its time starts now.
	waiting := func() {
		lastHeard = time.Now()
		if d := time.Now().Add(LeaseWait); d.After(expect) {
			expect = d
			reset()
		}
	}
	// attested takes in an attestation: one of the base by a validator ahead means it has
	// verified the base and can lead now.
	attested := func(a bus.Received[gossip.Attestation]) {
		if slices.Contains(ahead, a.From) && slices.Equal(a.Msg.Head, baseID.Bytes()) {
			waiting()
		}
	}
	// onHead takes in a head: the base re-published by a validator ahead, or a proposal
	// for this round to check (checks.go).
	onHead := func(h bus.Received[gossip.Head]) {
		if baseStillOpen(h, baseID, ahead) {
			waiting()
			return
		}
		v.proposed(ctx, h.From, h.Msg)
	}
	for {
		select {
		case <-ctx.Done():
			return next{}, ctx.Err()
		case <-changed:
			return next{}, errHeadMoved
		case a := <-in.Announces:
			v.trainers.seen(a.From, a.Msg)
			if v.waitingForFleet(granted) {
				stuckAt = time.Now().Add(stuckRounds * v.Config.Lease.RoundTimeout)
			}
		case c := <-in.Contributions:
			v.noteSpeed(c.From, c.Msg)
			v.noteReport(c.From, c.Msg, r)
		case l := <-in.Leases:
			heard(l)
		case a := <-in.Attestations:
			attested(a)
		case h := <-in.Heads:
			onHead(h)
		case res := <-v.checks.done:
			if v.checkDone(ctx, res, r) {
				return awaiting(r, v.locks[r]), nil
			}
		case <-timer.C:
			// Grants, heartbeats, attestations and re-published proposals queued while this
			// loop was busy (starved of CPU) come first: a leader is
			// silent only if nothing of it arrived, not because nothing was read.
			for drained := false; !drained; {
				select {
				case l := <-in.Leases:
					heard(l)
				case a := <-in.Attestations:
					attested(a)
				case h := <-in.Heads:
					onHead(h)
				default:
					drained = true
				}
			}
			if v.checks.busy(r) {
				// A proposal of the round is being checked: no takeover before its verdict (the
				// timer looks again in LeaseGrace).
				timer.Stop()
				timer = time.NewTimer(LeaseGrace)
				continue
			}
			if time.Now().Before(takeoverAt()) {
				reset()
				continue
			}
			if len(v.trainers.live()) == 0 {
				// Nothing to lead without trainers.
				expect = time.Now().Add(LeaseWait)
				if stuckAt.Before(expect) {
					stuckAt = expect
				}
				reset()
				continue
			}
			if time.Now().Before(silentAt()) && v.waitingForFleet(granted) {
				stuckAt = time.Now().Add(stuckRounds * v.Config.Lease.RoundTimeout)
				reset()
				continue
			}
			if time.Now().Before(silentAt()) {
				v.Log.Warn("the leader is heard but has brought no head to quorum; taking the round over", "round", r, "rank", rank,
					"leader", order[active], "waited", (stuckRounds * v.Config.Lease.RoundTimeout).String())
				v.Sink.Event("takeover", "round %d: %s was heard but brought no head to quorum in %d round timeouts; taking the round over (rank %d)",
					r, order[active], stuckRounds, rank)
			} else {
				lastAgo := "never"
				if !lastHeard.IsZero() {
					lastAgo = time.Since(lastHeard).Round(time.Millisecond).String()
				}
				v.Log.Warn("the validators ahead are silent; taking the round over", "round", r, "rank", rank, "leader", order[0],
					"last_heard_ago", lastAgo, "late_by", time.Since(silentAt()).Round(time.Millisecond).String())
				v.Sink.Event("takeover", "round %d: %s was silent; taking the round over (rank %d)", r, order[0], rank)
			}
			return leading(baseID, base, uint64(rank)<<16), nil
		}
	}
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
// that validator has not seen the base reach its quorum yet (awaitQuorum re-publishes it
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
