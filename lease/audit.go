package lease

import (
	"errors"
	"fmt"
	"slices"

	"github.com/p2pnode/p2pnode/chain"
)

// ErrAudit is wrapped by every audit failure.
var ErrAudit = errors.New("ledger audit failed")

// Report is what an audit of a head chain proved.
type Report struct {
	Heads             int    `json:"heads"`
	Plan              string `json:"plan"`
	Shards            uint32 `json:"microshards"`
	EpochsCompleted   uint64 `json:"epochs_completed"`
	ConsumedInEpoch   int    `json:"consumed_in_current_epoch"`
	MicroshardsMerged uint64 `json:"microshards_merged"`
	// MicroshardsAhead: of those, merged in the epoch after their head's (leased to
	// trainers their epoch had nothing left for, Lease.Ahead); ConsumedInEpoch counts them
	// once their epoch is the current one.
	MicroshardsAhead uint64 `json:"microshards_merged_ahead"`
	// Duplicated and Lost count the microshards of the failing round that were merged a
	// second time in their epoch, or that a head's epoch ended without; they are non-zero
	// only together with an audit error.
	Duplicated int `json:"duplicated"`
	Lost       int `json:"lost"`
}

// Audit replays the ledger along heads (genesis first) and proves that every microshard was
// consumed exactly once per epoch: each head's ledger must equal its parent's ledger with
// the head's merged microshards applied, no microshard may be merged twice in an epoch, and
// an epoch only ends when every microshard was consumed. The first violation is returned as
// an error naming the round.
func Audit(heads []*chain.Head) (Report, error) {
	var r Report
	if len(heads) == 0 {
		return r, fmt.Errorf("%w: no heads", ErrAudit)
	}
	g := heads[0]
	if g.Round != 0 || len(g.Contributions) != 0 || Count(g.Ledger) != 0 || g.Ledger.Epoch != 0 {
		return r, fmt.Errorf("%w: chain does not start at a clean genesis", ErrAudit)
	}
	r.Plan, r.Shards = g.Ledger.Plan, g.Ledger.Shards
	prev := g.Ledger
	for _, h := range heads[1:] {
		if h.Ledger.Plan != r.Plan || h.Ledger.Shards != r.Shards {
			return r, fmt.Errorf("%w: round %d changes the dataset plan", ErrAudit, h.Round)
		}
		for _, c := range h.Contributions {
			r.MicroshardsMerged += uint64(len(c.Microshards))
			if c.Ahead {
				r.MicroshardsAhead += uint64(len(c.Microshards))
			}
		}
		want, err := Apply(prev, h.Contributions)
		if err != nil {
			if errors.Is(err, ErrDuplicate) {
				r.Duplicated++
			}
			return r, fmt.Errorf("%w: round %d: %v", ErrAudit, h.Round, err)
		}
		if want.Epoch != h.Ledger.Epoch || !slices.Equal(want.Consumed, h.Ledger.Consumed) || !slices.Equal(want.Ahead, h.Ledger.Ahead) {
			if h.Ledger.Epoch > want.Epoch {
				r.Lost = int(r.Shards) - Count(want)
			}
			return r, fmt.Errorf("%w: round %d: ledger (epoch %d, %d consumed) differs from its parent plus merged microshards (epoch %d, %d consumed)",
				ErrAudit, h.Round, h.Ledger.Epoch, Count(h.Ledger), want.Epoch, Count(want))
		}
		prev = h.Ledger
	}
	r.Heads = len(heads)
	r.EpochsCompleted = prev.Epoch
	r.ConsumedInEpoch = Count(prev)
	return r, nil
}
