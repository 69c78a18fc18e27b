package validator

import (
	"slices"

	"github.com/p2pnode/p2pnode/lease"
)

// Leases of the next epoch. An epoch's last rounds lease what it has left, and with
// protocol.overlap: eager its first round's trainers reserve much of the rest
// (overlap.go): a trainer that joins, or comes back from a fault, after those grants
// finds nothing to lease, and used to wait for the epoch to end, up to its whole length on
// a small dataset (docs/wan.md). Such a trainer is leased microshards of the next epoch
// instead (lease.Lease.Ahead): the head that merges its update consumes them in that epoch
// (chain.Ledger.Ahead), which then starts with them consumed. A lease of the next epoch
// reserves nothing, and the round's reservations drawn from the next epoch leave its
// microshards out (nextPool).

// leaseAhead leases the trainers of others that fresh gave nothing, when the epoch had
// nothing left for them (every one of its rest microshards went to fresh), from what the
// next epoch has that no update of the round took: each a window's share, as a lease.
func (r *openRound) leaseAhead(others []lease.Trainer, fresh map[string][]uint32, rest, share, budget, innerSteps int, seed []byte) (map[string][]uint32, map[string]int) {
	leased := 0
	for _, ms := range fresh {
		leased += len(ms)
	}
	var idle []lease.Trainer
	for _, t := range others {
		if len(fresh[t.Peer]) == 0 {
			idle = append(idle, t)
		}
	}
	if len(idle) == 0 || leased < rest || budget <= 0 {
		return nil, nil
	}
	taken := r.aheadNow()
	var pool []uint32
	for _, s := range lease.AvailableAhead(r.base.Ledger) {
		if !taken[s] {
			pool = append(pool, s)
		}
	}
	plan := lease.AssignWithin(pool, idle, share, budget, append(slices.Clone(seed), 'a'))
	return plan, lease.WindowSteps(lease.Steps(idle, innerSteps), plan, idle, share)
}

// aheadNow are the next epoch's microshards leased to updates of the round received or
// being fetched.
func (r *openRound) aheadNow() map[uint32]bool {
	return r.ofUpdates(func(rc received) []uint32 { return rc.msg.Microshards }, true)
}
