package round

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/lease"
)

// ErrMismatch is returned when a recomputed head differs from the proposed one.
var ErrMismatch = errors.New("recomputed head differs from the proposal")

// CheckLeases checks a round's leases against the base head: each one valid for it, none
// sharing a microshard with another, and every candidate covered by the lease it names (same
// trainer, same microshards).
func CheckLeases(baseID cid.Cid, base *chain.Head, leases []lease.Lease, cands []Candidate) error {
	byID := map[cid.Cid]lease.Lease{}
	owner := map[uint32]string{}
	for _, l := range leases {
		if err := l.Check(baseID, base); err != nil {
			return err
		}
		for _, s := range l.Microshards {
			if o, taken := owner[s]; taken {
				return fmt.Errorf("%w: microshard %d leased to both %s and %s", lease.ErrInvalid, s, o, l.Trainer)
			}
			owner[s] = l.Trainer
		}
		byID[l.ID()] = l
	}
	for _, c := range cands {
		l, ok := byID[c.Lease]
		if !ok {
			return fmt.Errorf("%w: candidate of %s names lease %s, which is not in the round", lease.ErrInvalid, c.Peer, c.Lease)
		}
		if l.Trainer != c.Peer || !slices.Equal(l.Microshards, c.Microshards) {
			return fmt.Errorf("%w: candidate of %s does not match its lease", lease.ErrInvalid, c.Peer)
		}
	}
	return nil
}

// Verify recomputes a proposed head from the same base and candidates and checks that it
// has the proposed CID. The candidates' deltas must already be in the store.
func (m *Merger) Verify(ctx context.Context, baseID cid.Cid, base *chain.Head, leases []lease.Lease, cands []Candidate, ref, proposed cid.Cid) error {
	if err := CheckLeases(baseID, base, leases, cands); err != nil {
		return fmt.Errorf("verify head %s: %w", proposed, err)
	}
	out, err := m.MergeWith(ctx, baseID, base, cands, ref)
	if err != nil {
		return fmt.Errorf("verify head %s: %w", proposed, err)
	}
	if !out.ID.Equals(proposed) {
		return fmt.Errorf("verify head %s: %w: recomputed %s", proposed, ErrMismatch, out.ID)
	}
	return nil
}
