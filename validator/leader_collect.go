package validator

import (
	"fmt"
	"slices"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// The leader's collecting phase: contributions checked against the attempt's leases,
// releases, expired leases and trainers that left or came back.

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
		if v.trainers.isLive(p) {
			// Still here and still silent: its window ran past the deadline.
			r.recordMiss(p, r.returns[p], r.window)
		}
	}
	v.Sink.Status(func(vs *Status) { vs.Barred = r.book.Barred() })
}

// missedDeadline is a deadline a trainer let pass while it stayed: returns is how often it
// had come back (trainerSet.returns) when it missed it.
type missedDeadline struct {
	returns int
	window  time.Duration
}

// recordMiss records that p, having come back returns times, let an attempt of window
// pass with nothing delivered.
func (r *openRound) recordMiss(p string, returns int, window time.Duration) {
	m := r.missed[p]
	if m.returns != returns {
		m = missedDeadline{returns: returns}
	}
	m.window = max(m.window, window)
	r.missed[p] = m
}

// missedBy is the longest deadline of the round p missed as the process it is now (it has
// come back returns times): 0 if it missed none, or came back since (it was killed, not
// slow).
func (r *openRound) missedBy(p string, returns int) time.Duration {
	if m, ok := r.missed[p]; ok && m.returns == returns {
		return m.window
	}
	return 0
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
			r.fetches.drop(p)
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
	if time.Now().Before(r.deadline) && r.book.Rehold(from, leaseID) {
		// It fell silent and its lease was settled (noticeReturns), but it trained on: a
		// router that forgot its mappings, a link down for seconds. The attempt is still
		// open and nothing else was done with the lease's microshards.
		v.Log.Info("trainer back with a contribution on the lease its silence settled: it counts", "round", r.round, "peer", from)
		v.Sink.Event("release", "round %d: %s was back in time; its contribution on the lease its silence settled counts", r.round, from)
		v.Sink.Status(func(vs *Status) { vs.Barred = r.book.Barred() })
	}
	if !ok || l.Trainer != from || !r.book.Holds(from, leaseID) {
		issuer := v.grants.issuer(r.round, r.baseID, leaseID, from)
		switch {
		case slices.ContainsFunc(r.all, func(x lease.Lease) bool { return x.ID().Equals(leaseID) && x.Trainer == from }):
			reject(false, "late", "lease %s expired or was settled with an earlier attempt", leaseID)
		case issuer == v.Self:
			// This validator granted it when it led the round before it stepped aside, or
			// before it restarted (GrantsFile).
			reject(false, "late", "lease %s was granted by this validator before it stepped aside or restarted in round %d", leaseID, r.round)
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
	// A sign of life, as an announcement is: a trainer whose announcements are held up
	// (just back on a new connection) is not taken for silent while its update arrives.
	v.trainers.heard(from)
	hint, _ := peer.Decode(from)
	// The deadline is for announcing: an update announced in time may take what the
	// trainer's uplink takes (a 68 MB fp32 update is 27 s at 20 Mbit/s), up to
	// lease.round_timeout, and the artifact layer gives up on a holder that stalls.
	// An update larger than the experiment's encoding allows is not downloaded: its
	// manifest says so (artifact.ErrTooLarge, rejected wrong_codec when it returns).
	r.fetches.start(v.Bus, from, received{msg: c, lease: l, id: leaseID}, deltaID, hint, r.maxDelta, time.Now().Add(v.Config.Lease.RoundTimeout))
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

// reject counts a rejected contribution of peer to the round, for the round notes.
func (r *openRound) reject(peer, reason string) {
	r.rejected++
	if len(r.rejections) < chain.MaxNoteEntries {
		r.rejections = append(r.rejections, chain.Rejection{Peer: peer, Reason: reason})
	}
}
