package validator

import (
	"slices"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/lease"
)

// Overlap (protocol.overlap: eager). Each lease of a round also reserves its trainer's
// microshards for the round after (lease.Lease.Next, with NextSteps): drawn from what the
// round leaves in the pool, so no two reservations of a round, and no reservation and
// lease of it, share a microshard. A trainer that has published its update trains its
// reservation at once, from its own model, instead of waiting for the next head. The next
// round's leader leases a trainer its reservation again when the trainer's update was
// merged into the base head (the head names the lease) and every reserved microshard is
// still available; the reserved steps go with it. Otherwise the trainer gets a lease as
// any other and drops what it trained ahead.
//
// Honouring a reservation is this leader's choice, like the capacity weights: a follower
// checks the lease as any other (lease.Lease.Check), so a restarted leader that lost its
// grant log, or a round whose leader never heard the grant, only costs the trainers their
// head start. Later attempts of a round do not lease the reservations of updates already
// received (reservedNow), so those stay honourable.

// reservation is the next round's microshards and steps a merged lease reserved.
type reservation struct {
	next  []uint32
	steps int
}

// reservations returns, by trainer, what the leases merged into r's base head reserved,
// as far as this validator heard their grants.
func (v *validator) reservations(r *openRound) map[string]reservation {
	out := map[string]reservation{}
	if v.Config.Protocol.Overlap != config.OverlapEager {
		return out
	}
	for _, c := range r.base.Contributions {
		id, err := cid.Cast(c.Lease)
		if err != nil {
			continue
		}
		g, ok := v.grants.rounds[r.base.Round][id]
		if !ok || g.trainer != c.Peer || len(g.next) == 0 {
			continue
		}
		out[c.Peer] = reservation{next: g.next, steps: int(g.nextSteps)}
	}
	return out
}

// honour leases each candidate its reservation when every reserved microshard is in
// avail, within budget microshards in all. It returns those leases and steps, and what is
// left of avail and of the candidates for the usual assignment.
func honour(res map[string]reservation, avail []uint32, work []lease.Trainer, budget int) (plan map[string][]uint32, steps map[string]int, rest []uint32, others []lease.Trainer) {
	plan, steps = map[string][]uint32{}, map[string]int{}
	if len(res) == 0 { // no overlap, or nothing reserved: nothing to set apart
		return plan, steps, avail, work
	}
	free := map[uint32]bool{}
	for _, s := range avail {
		free[s] = true
	}
	for _, t := range work {
		rv, ok := res[t.Peer]
		if !ok || len(rv.next) > budget || !allIn(rv.next, free) {
			others = append(others, t)
			continue
		}
		budget -= len(rv.next)
		for _, s := range rv.next {
			delete(free, s)
		}
		plan[t.Peer], steps[t.Peer] = rv.next, rv.steps
	}
	for _, s := range avail {
		if free[s] {
			rest = append(rest, s)
		}
	}
	return plan, steps, rest, others
}

func allIn(xs []uint32, set map[uint32]bool) bool {
	for _, x := range xs {
		if !set[x] {
			return false
		}
	}
	return true
}

// reserve draws the next round's reservations of the peers leased now from what is left
// of avail after plan, within budget (what the round's bound leaves after plan): the same
// rule as a lease (lease.AssignWithin with the window share, raised by lease.AbsorbTail where
// the next round is the epoch's last full one, and lease.WindowSteps), on another seed.
func reserve(avail []uint32, plan map[string][]uint32, work []lease.Trainer, share, budget, innerSteps int, seed []byte) (map[string][]uint32, map[string]int) {
	leased := map[uint32]bool{}
	for _, ms := range plan {
		for _, s := range ms {
			leased[s] = true
		}
	}
	var left []uint32
	for _, s := range avail {
		if !leased[s] {
			left = append(left, s)
		}
	}
	var who []lease.Trainer
	for _, t := range work {
		if _, ok := plan[t.Peer]; ok {
			who = append(who, t)
		}
	}
	next := lease.AssignWithin(left, who, lease.AbsorbTail(len(left), who, share), budget, append(slices.Clone(seed), 'n'))
	return next, lease.WindowSteps(lease.Steps(who, innerSteps), next, who, share)
}

// nextPool is what the next round's reservations are drawn from: what avail keeps past
// plan, or, when plan leases the epoch's last microshards (the next head starts a new
// epoch), the whole plan of the dataset but what the round reserved already. Without
// that, every epoch's first round would find no trainer with a window trained ahead.
// Should the epoch not roll over (a lease of its tail fails), the reservations drawn from
// the next one are not available on the next head and are not honoured.
func (r *openRound) nextPool(avail []uint32, plan, ahead map[string][]uint32) []uint32 {
	leased := 0
	for _, ms := range plan {
		leased += len(ms)
	}
	if leased < len(avail) {
		return avail
	}
	// Nor what the next epoch's leases of the round take (ahead.go).
	taken := r.aheadNow()
	for _, ms := range ahead {
		for _, s := range ms {
			taken[s] = true
		}
	}
	reserved := r.reservedNow()
	var all []uint32
	for _, s := range lease.AvailableAhead(r.base.Ledger) {
		if !reserved[s] && !taken[s] {
			all = append(all, s)
		}
	}
	return all
}

// reservedNow are the microshards reserved by the leases of the round's updates received
// or being fetched: a later attempt leaves them for the next round.
func (r *openRound) reservedNow() map[uint32]bool {
	return r.ofUpdates(func(rc received) []uint32 { return rc.lease.Next }, false)
}

// ofUpdates gathers the microshards list(rc) names for each update of the round received
// or being fetched, of the leases of the next epoch (ahead) or of the others.
func (r *openRound) ofUpdates(list func(rc received) []uint32, ahead bool) map[uint32]bool {
	out := map[uint32]bool{}
	add := func(rc received) {
		if rc.lease.Ahead(r.base) != ahead {
			return
		}
		for _, s := range list(rc) {
			out[s] = true
		}
	}
	for _, rc := range r.received {
		add(rc)
	}
	for _, pf := range r.fetches.pending {
		add(pf.rc)
	}
	return out
}
