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
// sharing a microshard of its epoch with another, and every candidate covered by the lease
// it names (same trainer, same microshards, of the next epoch where the lease is).
func CheckLeases(baseID cid.Cid, base *chain.Head, leases []lease.Lease, cands []Candidate) error {
	type shard struct {
		s     uint32
		ahead bool
	}
	byID := map[cid.Cid]lease.Lease{}
	owner := map[shard]string{}
	for _, l := range leases {
		if err := l.Check(baseID, base); err != nil {
			return err
		}
		for _, s := range l.Microshards {
			k := shard{s, l.Ahead(base)}
			if o, taken := owner[k]; taken {
				return fmt.Errorf("%w: microshard %d of epoch %d leased to both %s and %s", lease.ErrInvalid, s, l.Epoch, o, l.Trainer)
			}
			owner[k] = l.Trainer
		}
		byID[l.ID()] = l
	}
	for _, c := range cands {
		l, ok := byID[c.Lease]
		if !ok {
			return fmt.Errorf("%w: candidate of %s names lease %s, which is not in the round", lease.ErrInvalid, c.Peer, c.Lease)
		}
		if l.Trainer != c.Peer || !slices.Equal(l.Microshards, c.Microshards) || l.Ahead(base) != c.Ahead {
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
