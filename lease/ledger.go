package lease

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/p2pnode/p2pnode/chain"
)

// ErrDuplicate is returned when a microshard would be consumed twice in one epoch.
var ErrDuplicate = errors.New("microshard already consumed this epoch")

// NewLedger starts epoch 0 of a plan with nothing consumed.
func NewLedger(planID string, shards int) chain.Ledger {
	return chain.Ledger{Plan: planID, Shards: uint32(shards), Consumed: make([]byte, (shards+7)/8)}
}

// consumed reports whether microshard i is consumed this epoch. A bit beyond the bitmap (a
// ledger whose bitmap is shorter than Shards says, which chain.Head's decoding rejects)
// counts as consumed: never leased, never a panic.
func consumed(l chain.Ledger, i uint32) bool {
	if int(i/8) >= len(l.Consumed) {
		return true
	}
	return l.Consumed[i/8]&(1<<(i%8)) != 0
}

// Available lists, in ascending order, the microshards of the current epoch not yet consumed.
func Available(l chain.Ledger) []uint32 { return unconsumed(l, consumed, Count(l)) }

// unconsumed lists, in ascending order, the microshards of l's plan that taken says are not
// (n of them are: the list's room is the rest); never nil.
func unconsumed(l chain.Ledger, taken func(chain.Ledger, uint32) bool, n int) []uint32 {
	out := make([]uint32, 0, max(0, int(l.Shards)-n))
	for i := uint32(0); i < l.Shards; i++ {
		if !taken(l, i) {
			out = append(out, i)
		}
	}
	return out
}

// Count is the number of microshards consumed in the current epoch.
func Count(l chain.Ledger) int {
	n := 0
	for _, b := range l.Consumed {
		n += bits.OnesCount8(b)
	}
	return n
}

// consumedAhead reports whether microshard i of the epoch after the ledger's was consumed
// early (chain.Ledger.Ahead); out of range counts as consumed, as in consumed.
func consumedAhead(l chain.Ledger, i uint32) bool {
	if i >= l.Shards {
		return true
	}
	return int(i/8) < len(l.Ahead) && l.Ahead[i/8]&(1<<(i%8)) != 0
}

// AvailableAhead lists, in ascending order, the microshards of the epoch after the
// ledger's not yet consumed: what a lease of the next epoch may grant (Lease.Check).
func AvailableAhead(l chain.Ledger) []uint32 {
	return unconsumed(l, consumedAhead, Count(chain.Ledger{Consumed: l.Ahead}))
}

// Apply returns the ledger after the merged contributions' microshards are consumed: of
// the ledger's epoch, or of the next one for a contribution marked Ahead (its lease was of
// the next epoch, granted when the ledger's had nothing left to lease). When the epoch
// becomes complete the next one starts with what was consumed of it ahead. Any microshard
// out of range or already consumed in its epoch is an error and the ledger is unchanged.
// A ledger with nothing consumed ahead has no Ahead bitmap, so heads that never leased
// ahead encode as before it existed.
func Apply(l chain.Ledger, merged []chain.Contribution) (chain.Ledger, error) {
	next := chain.Ledger{Plan: l.Plan, Shards: l.Shards, Epoch: l.Epoch, Consumed: slices.Clone(l.Consumed), Ahead: slices.Clone(l.Ahead)}
	for _, c := range merged {
		for _, i := range c.Microshards {
			if i >= l.Shards {
				return l, fmt.Errorf("microshard %d out of range (plan has %d)", i, l.Shards)
			}
			if !c.Ahead {
				if consumed(next, i) {
					return l, fmt.Errorf("%w: microshard %d in epoch %d", ErrDuplicate, i, l.Epoch)
				}
				next.Consumed[i/8] |= 1 << (i % 8)
				continue
			}
			if consumedAhead(next, i) {
				return l, fmt.Errorf("%w: microshard %d in epoch %d (leased ahead)", ErrDuplicate, i, l.Epoch+1)
			}
			if next.Ahead == nil {
				next.Ahead = make([]byte, len(next.Consumed))
			}
			next.Ahead[i/8] |= 1 << (i % 8)
		}
	}
	if l.Shards > 0 && Count(next) == int(l.Shards) {
		next.Epoch++
		clear(next.Consumed)
		if next.Ahead != nil {
			copy(next.Consumed, next.Ahead)
			next.Ahead = nil
		}
	}
	return next, nil
}
