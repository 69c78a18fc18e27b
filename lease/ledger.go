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
func Available(l chain.Ledger) []uint32 {
	out := make([]uint32, 0, max(0, int(l.Shards)-Count(l)))
	for i := uint32(0); i < l.Shards; i++ {
		if !consumed(l, i) {
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

// Apply returns the ledger after the given merged microshards are consumed. When the epoch
// becomes complete the next epoch starts with nothing consumed. Any microshard out of range
// or already consumed this epoch is an error and the ledger is unchanged.
func Apply(l chain.Ledger, merged ...[]uint32) (chain.Ledger, error) {
	next := chain.Ledger{Plan: l.Plan, Shards: l.Shards, Epoch: l.Epoch, Consumed: slices.Clone(l.Consumed)}
	for _, shards := range merged {
		for _, i := range shards {
			if i >= l.Shards {
				return l, fmt.Errorf("microshard %d out of range (plan has %d)", i, l.Shards)
			}
			if consumed(next, i) {
				return l, fmt.Errorf("%w: microshard %d in epoch %d", ErrDuplicate, i, l.Epoch)
			}
			next.Consumed[i/8] |= 1 << (i % 8)
		}
	}
	if l.Shards > 0 && Count(next) == int(l.Shards) {
		next.Epoch++
		clear(next.Consumed)
	}
	return next, nil
}
