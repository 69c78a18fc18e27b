package validator

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
)

// Two leaders of one round. A follower takes a round over when the validators ahead of it
// seem silent (follow), and under CPU starvation a leader's heartbeats can arrive seconds
// late: the follower then takes over from a leader that is alive. The takeover is
// signalled by what the new leader publishes for the round — its heartbeats and grants
// (gossip.Leases on the round's base, signed by their issuer through gossip) and, later,
// its proposal. Every node computes the same order (lease.Leaders), and a validator only
// ever takes over from the validators ahead of it, so "the later one in the order leads"
// is a rule every validator can apply alone:
//
//   - a leader that hears a validator after it in the order lead its round steps aside:
//     it grants and collects nothing more, proposes nothing, and verifies and attests
//     the new leader's proposal like a follower (standAside). It has signed no head of
//     the round then (a leader signs only its own proposal, and one that has proposed
//     is awaiting its quorum), so the lock rule lets it attest.
//   - a leader that had already proposed when the takeover came stays locked to its own
//     proposal (a validator never signs two heads of one round). The two proposals then
//     compete for the validators that signed neither: with an odd number of validators
//     and a majority quorum one of two proposals always gets it, and the other proposer's
//     wait for its quorum ends when that head becomes canonical, so the next round starts. (With
//     an even number the signatures can split evenly and the round waits; stepping aside
//     before proposing is what keeps that rare.)
//   - a contribution made under the lease of another validator of the experiment, for the
//     same round and base, is rejected as foreign_lease without a strike toward
//     quarantine: the trainer did what a validator asked, the mix-up is the validators'
//     (accept). A contribution can reach the new leader before the grant that carried its
//     lease (that validator's messages reach it late): its verdict then waits for the
//     round's end here (hold, settleHeld); a lease no validator is known to have granted by
//     then still strikes (no_lease).

// ReasonForeignLease rejects a contribution made under another validator's lease of the
// round, without a strike.
const ReasonForeignLease = "foreign_lease"

// maxGrantsKept bounds the leases of one round a validator remembers from the others' grants.
const maxGrantsKept = 1 << 14

// grantLog remembers the leases the validators (this one too) granted for the round open
// here and the one closed last, so that the leader of a round can tell a contribution made
// under another validator's lease from one under a lease nobody granted, and a trainer
// busy with another validator's lease of the round before (staleForeign). Gossip admits a
// grant only from the validator it names as issuer (gossip.checkLeases), so a lease
// recorded here was granted by that validator.
type grantLog struct {
	rounds map[uint64]map[cid.Cid]grantedLease
}

type grantedLease struct {
	base    string // the base head's CID bytes
	trainer string
	issuer  string
	// next and nextSteps are the lease's reservation for the round after (overlap.go).
	next      []uint32
	nextSteps uint32
}

func newGrantLog() *grantLog { return &grantLog{rounds: map[uint64]map[cid.Cid]grantedLease{}} }

// record takes in a grant published by from; leases in it that name another issuer,
// round or base than the grant are not recorded.
func (g *grantLog) record(from string, m *gossip.Leases) {
	if m.Issuer != from || len(m.Leases) == 0 {
		return
	}
	kept := g.rounds[m.Round]
	for i := range m.Leases {
		l := &m.Leases[i]
		if l.Issuer != from || l.Round != m.Round || !slices.Equal(l.Base, m.Base) {
			continue
		}
		if kept == nil {
			kept = map[cid.Cid]grantedLease{}
			g.rounds[m.Round] = kept
		}
		if len(kept) >= maxGrantsKept {
			return
		}
		kept[l.ID()] = grantedLease{base: string(l.Base), trainer: l.Trainer, issuer: from, next: l.Next, nextSteps: l.NextSteps}
	}
}

// issuer returns the validator that granted lease id to trainer for round on base, or ""
// when no other validator is known to have.
func (g *grantLog) issuer(round uint64, base cid.Cid, id cid.Cid, trainer string) string {
	l, ok := g.rounds[round][id]
	if !ok || l.trainer != trainer || l.base != string(base.Bytes()) {
		return ""
	}
	return l.issuer
}

// prune forgets the rounds up to below (closed here).
func (g *grantLog) prune(below uint64) {
	for r := range g.rounds {
		if r <= below {
			delete(g.rounds, r)
		}
	}
}

// grantHeard takes in a grant or heartbeat read while this validator leads round r: it
// remembers the leases of other validators (accept), and notes a validator after this one
// in the round's order that leads the same round: it took the round over.
func (v *validator) grantHeard(r *openRound, l bus.Received[gossip.Leases]) {
	if !v.recordGrant(l) {
		return
	}
	if len(r.held) > 0 {
		v.settleHeld(r, false)
	}
	if r.takenBy != "" || l.Msg.Round != r.round || !slices.Equal(l.Msg.Base, r.baseID.Bytes()) {
		return
	}
	if k := slices.Index(r.order, l.From); k > r.rank {
		r.takenBy = l.From
	}
}

// recordGrant remembers the leases of a grant or heartbeat from another validator (accept
// reads them, should this validator lead the round), and says whether it came from a
// validator at all.
func (v *validator) recordGrant(l bus.Received[gossip.Leases]) bool {
	if !v.isValidator(l.From) {
		return false
	}
	v.grants.record(l.From, l.Msg)
	return true
}

// drainGrants reads the grants queued in the inbox: before a contribution is judged (its
// lease may be another validator's) and before a proposal is made (a takeover heard only
// now still comes first).
func (v *validator) drainGrants(r *openRound, in *bus.Inbox) {
	for {
		select {
		case l := <-in.Leases:
			v.grantHeard(r, l)
		default:
			return
		}
	}
}

// standAside is the rest of the round for a leader that heard a validator after it in the
// order lead the round (grantHeard): standing aside. It grants, collects and proposes
// nothing, and stops its heartbeats; it checks and attests the new leader's proposal like
// any follower, and follows it to quorum. Leases it granted before are not withdrawn: their
// trainers' contributions reach the new leader, which rejects them without a strike
// (foreign_lease). Should every validator after it fall silent, as a follower would judge
// it, it hands over to leading the round again with fresh attempts.
func (p *leadPhase) standAside() {
	v, r := p.v, p.r
	v.Log.Warn("a later validator in the order took the round over; stepping aside", "round", r.round, "rank", r.rank,
		"new_leader", r.takenBy, "attempts", r.attempt+1, "received", len(r.received))
	v.Sink.Event("stepaside", "round %d: %s took the round over; stepping aside (leasing and proposing nothing more)", r.round, r.takenBy)
	p.goAside()
}

// unreachable says whether the pass that just failed (lease.NewPass: nothing received)
// failed only because this leader could not get the updates: every barred trainer's update
// was unavailable (its fetch failed: the trainer is behind NAT and never dialed this
// validator, say). Another validator may reach those trainers, and there is a later one
// to hand the round on to.
func (p *leadPhase) unreachable(why string) bool {
	return why == reasonUnavailable && p.r.rank+1 < len(p.r.order)
}

// handOn stands aside in a round this leader cannot gather (unreachable), before anyone
// takes it over: it stops its heartbeats, so the next validator in the order takes the
// round over as from a silent leader, and it checks and attests that one's proposal. It
// has proposed nothing and signed no head of the round, so it can, whatever the quorum:
// the pass-over of a leader that is heard but stuck (follower.go) needs a majority quorum,
// and with two validators and a quorum of two a leader that could reach no trainer held
// the round forever (docs/wan.md, "A second validator behind NAT"). Should no later
// validator lead, it leads the round again (aside.retakeAt).
func (p *leadPhase) handOn() {
	v, r := p.v, p.r
	v.Log.Warn("no update of this round could be fetched from its trainer; handing the round on to the next validator",
		"round", r.round, "rank", r.rank, "next", r.order[r.rank+1], "attempts", r.attempt+1, "pass", r.book.Passes()+1)
	v.Sink.Event("stepaside", "round %d: no update could be fetched from the trainers; handing the round on to %s", r.round, r.order[r.rank+1])
	p.goAside()
}

// goAside enters standing aside (standAside, handOn).
func (p *leadPhase) goAside() {
	v, r := p.v, p.r
	p.sub = PhaseStandingAside
	p.stopBeat()
	v.enter(PhaseStandingAside, r.round)
	p.aside = &aside{later: r.order[r.rank+1:], expect: time.Now().Add(LeaseWait)}
	p.aside.timer = time.NewTimer(time.Until(p.aside.retakeAt()))
}

// aside is the state of a leader standing aside.
type aside struct {
	later  []string  // the validators after this one in the round's order
	expect time.Time // when a later validator must have shown progress by
	timer  *time.Timer
	// deferred is since when checks of the round's proposals have held the retake back
	// (checks.holdBack).
	deferred time.Time
}

// retakeAt is when this validator takes the round back: every later validator gets its
// turn (TakeoverStep each, as in following) first.
func (a *aside) retakeAt() time.Time { return a.expect.Add(time.Duration(len(a.later)) * TakeoverStep) }

func (a *aside) reset() {
	a.timer.Reset(time.Until(a.retakeAt()))
}

func (a *aside) alive(until time.Time) {
	if until.After(a.expect) {
		a.expect = until
		a.reset()
	}
}

func (a *aside) timerOrNil() *time.Timer {
	if a == nil {
		return nil
	}
	return a.timer
}

// asideHeard takes in a grant or heartbeat while standing aside.
func (p *leadPhase) asideHeard(l bus.Received[gossip.Leases]) {
	r := p.r
	if !p.v.recordGrant(l) {
		return
	}
	if l.Msg.Round == r.round && slices.Equal(l.Msg.Base, r.baseID.Bytes()) && slices.Contains(p.aside.later, l.From) {
		p.aside.alive(time.UnixMilli(l.Msg.Deadline).Add(LeaseGrace))
	}
}

// asideHead takes in a head while standing aside: a later validator's proposal of the
// round, re-published while it gathers its quorum, says it is alive (it sends no
// heartbeats once it has proposed); a proposal is checked.
func (p *leadPhase) asideHead(ctx context.Context, h bus.Received[gossip.Head]) {
	if hd, err := h.Msg.Signed.Decode(); err == nil && h.Msg.Proposal != nil && hd.Round == p.r.round && slices.Contains(p.aside.later, h.From) {
		p.aside.alive(time.Now().Add(republishEvery + LeaseGrace))
	}
	p.v.proposed(ctx, h.From, h.Msg)
}

func (p *leadPhase) onAside(ctx context.Context, in *bus.Inbox, ev event) (*next, error) {
	v, r := p.v, p.r
	switch {
	case ev.contribution != nil:
		v.overheard(*ev.contribution, r.round)
	case ev.leases != nil:
		p.asideHeard(*ev.leases)
	case ev.head != nil:
		p.asideHead(ctx, *ev.head)
	case ev.checked != nil:
		return v.verdict(ctx, *ev.checked, r.round), nil
	case ev.wake:
		// What queued while the loop was busy comes first, as in following.
		for drained := false; !drained; {
			select {
			case l := <-in.Leases:
				p.asideHeard(l)
			case h := <-in.Heads:
				p.asideHead(ctx, h)
			default:
				drained = true
			}
		}
		if v.checks.holdBack(r.round, &p.aside.deferred, v.Config.Lease.RoundTimeout) {
			// A proposal of the round is being checked: no retake before its verdict (the
			// timer looks again in LeaseGrace).
			p.aside.timer.Reset(LeaseGrace)
			return nil, nil
		}
		if time.Now().Before(p.aside.retakeAt()) {
			p.aside.reset()
			return nil, nil
		}
		v.Log.Warn("the validators that took the round over are silent; leading it again", "round", r.round, "rank", r.rank)
		v.Sink.Event("takeover", "round %d: the validators after this one in the order fell silent; leading the round again", r.round)
		n := leading(r.baseID, r.base, r.attempt+1)
		n.held, r.held = r.held, map[heldKey]string{} // their verdicts wait for the round's end
		return n, nil
	}
	return nil, nil
}

// maxHeldPerTrainer bounds the contributions of one trainer under unknown leases whose
// verdict waits in one round: an honest trainer holds at most one lease of each other
// validator that leads the round.
const maxHeldPerTrainer = 2

// reasonUnknownLease bars a trainer whose contribution names a lease no grant heard so far
// names: its verdict (foreign_lease or no_lease) waits (hold).
const reasonUnknownLease = "unknown_lease"

// heldKey is a contribution whose verdict waits: its trainer and the lease it names.
type heldKey struct {
	trainer string
	lease   cid.Cid
}

// hold keeps the verdict on from's contribution under lease id, which neither this
// validator nor any grant heard so far granted, until the round ends here (settleHeld):
// the grant of another validator leading the round can reach this one after a
// contribution made under it (its grants reach this validator late: that is why it took
// the round over). The trainer is barred from the round at once, as for any rejection: a
// peer that holds one of this validator's leases and announces under a made-up one must
// not hold the attempt open. It reports false, and holds nothing, when the trainer already
// has maxHeldPerTrainer verdicts waiting (or the round maxGrantsKept): that contribution
// strikes at once.
func (v *validator) hold(r *openRound, from string, id cid.Cid, artifact string) bool {
	k := heldKey{trainer: from, lease: id}
	if _, dup := r.held[k]; dup || len(r.held) >= maxGrantsKept {
		return false
	}
	n := 0
	for h := range r.held {
		if h.trainer == from {
			n++
		}
	}
	if n >= maxHeldPerTrainer {
		return false
	}
	if r.held == nil {
		r.held = map[heldKey]string{}
	}
	r.held[k] = artifact
	if r.book.Bar(from, reasonUnknownLease) {
		v.Sink.Status(func(vs *Status) { vs.Barred = r.book.Barred() })
	}
	v.Log.Debug("contribution under a lease no grant heard names; its verdict waits for the round's end", "round", r.round,
		"peer", from, "lease", id.String(), "artifact", artifact)
	return true
}

// settleHeld gives the verdicts that wait (hold): a contribution whose lease another
// validator is now known to have granted its trainer for the round (a grant heard since)
// is rejected as foreign_lease, without a strike; with final (the round ends here), every
// other one is rejected as no_lease, a strike, as it would have been at once. Only a grant
// gossip admitted from the validator it names clears a contribution (grantLog), so a peer
// that makes a lease up gains a delay of one round at most, never a pass.
func (v *validator) settleHeld(r *openRound, final bool) {
	keys := slices.SortedFunc(maps.Keys(r.held), func(a, b heldKey) int {
		return cmp.Or(cmp.Compare(a.trainer, b.trainer), cmp.Compare(a.lease.KeyString(), b.lease.KeyString()))
	})
	for _, k := range keys {
		art := r.held[k]
		switch issuer := v.grants.issuer(r.round, r.baseID, k.lease, k.trainer); {
		case issuer != "":
			r.foreign[k.trainer] = true
			r.reject(k.trainer, ReasonForeignLease)
			v.rejected(k.trainer, r.round, ReasonForeignLease, fmt.Sprintf("lease %s was granted by %s, another validator leading round %d (its grant was read after the contribution)",
				k.lease, issuer, r.round), art)
		case final:
			r.reject(k.trainer, "no_lease")
			v.rejected(k.trainer, r.round, "no_lease", fmt.Sprintf("lease %s was not granted to %s by any validator heard by the round's end", k.lease, k.trainer), art)
		default:
			continue
		}
		delete(r.held, k)
	}
}

// staleReport is the last contribution a trainer was read to report on a lease another
// validator is known to have granted it (grantLog), and the round open here when it was
// read.
type staleReport struct {
	round  uint64
	lease  cid.Cid
	readIn uint64
}

// overheard takes in a contribution read while this validator does not lead the round
// (following, standing aside): its trainer's speed, and what it tells of a lease of the
// round before (noteReport).
func (v *validator) overheard(c bus.Received[gossip.Contribution], open uint64) {
	v.noteSpeed(c.From, c.Msg, 0)
	v.noteReport(c.From, c.Msg, open)
}

// noteReport takes in a contribution read while round open is open here, in any loop
// (leading, following or standing aside): the leader of a round tells by it a trainer that
// missed its lease because it was still training a lease of the round before, granted by a
// validator whose leases that round's head could not merge (staleForeign). Only leases in
// the grant log are kept, so the reports are bounded like the grant log.
func (v *validator) noteReport(from string, c *gossip.Contribution, open uint64) {
	id, err := cid.Cast(c.Lease)
	base, berr := cid.Cast(c.Base)
	if c.Peer != from || err != nil || berr != nil || v.grants.issuer(c.Round, base, id, from) == "" {
		return
	}
	v.reports[from] = staleReport{round: c.Round, lease: id, readIn: open}
}

// forgetClosed drops what this validator remembers of the rounds before closed, the round
// whose head is now canonical here: the grants of closed itself are kept for one more
// round, to tell a trainer busy with a lease of it (staleForeign).
func (v *validator) forgetClosed(closed uint64) {
	if closed > 0 {
		v.grants.prune(closed - 1)
	}
	for p, rep := range v.reports {
		if rep.readIn <= closed {
			delete(v.reports, p)
		}
	}
}

// staleForeign says whether trainer p, whose lease of round r expired, was busy with a
// lease of the round before that a validator other than that round's proposer granted it:
// it reported on that lease while round r was open here. Two validators led the round
// before; the proposal of one lists only its own leases, so the other's could never be
// merged, and the trainer only did what a validator asked. A lease of the proposer itself
// does not count (a slow trainer's report that missed the merge), nor a lease nobody is
// known to have granted, nor a report read before round r opened here.
func (v *validator) staleForeign(r *openRound, p string) bool {
	rep, ok := v.reports[p]
	if !ok || rep.readIn != r.round || rep.round+1 != r.round || r.base == nil || r.base.Round != rep.round {
		return false
	}
	parent, err := cid.Cast(r.base.Parent)
	if err != nil {
		return false
	}
	issuer := v.grants.issuer(rep.round, parent, rep.lease, p)
	proposer := v.proposerOf(r.base, parent)
	return issuer != "" && proposer != "" && issuer != proposer
}

// proposerOf returns the validator that proposed h, on parent, as the grant log tells it:
// the issuer of the leases it merged (a proposal lists only its proposer's), or "" when the
// grant log names none of them.
func (v *validator) proposerOf(h *chain.Head, parent cid.Cid) string {
	for _, c := range h.Contributions {
		if id, err := cid.Cast(c.Lease); err == nil {
			if p := v.grants.issuer(h.Round, parent, id, c.Peer); p != "" {
				return p
			}
		}
	}
	return ""
}
