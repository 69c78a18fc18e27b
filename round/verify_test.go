package round

import (
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/lease"
)

// CheckLeases: a round's leases are disjoint within each epoch (one of the base's, or of
// the next, lease.Lease.Ahead), and every candidate matches its lease, the epoch included.
func TestCheckLeases(t *testing.T) {
	baseID := cids.Record([]byte("base"))
	ledger, err := lease.Apply(lease.NewLedger("plan", 8), []chain.Contribution{{Microshards: []uint32{0, 1, 2, 3, 4, 5}}})
	require.NoError(t, err)
	base := &chain.Head{Round: 3, Ledger: ledger}
	mk := func(trainer string, epoch uint64, ms ...uint32) lease.Lease {
		return lease.Lease{Round: 4, Base: baseID.Bytes(), Trainer: trainer, Microshards: ms, Issuer: "v", Epoch: epoch}
	}
	cand := func(l lease.Lease, ahead bool) Candidate {
		return Candidate{Peer: l.Trainer, Lease: l.ID(), Microshards: l.Microshards, Ahead: ahead}
	}
	a, b := mk("a", 0, 6, 7), mk("b", 1, 6, 7) // the same microshards, of two epochs
	cases := []struct {
		name   string
		leases []lease.Lease
		cands  []Candidate
		err    string
	}{
		{"the epoch's last and the next epoch's", []lease.Lease{a, b}, []Candidate{cand(a, false), cand(b, true)}, ""},
		{"two leases of one microshard of the next epoch", []lease.Lease{b, mk("c", 1, 7)}, nil, "microshard 7 of epoch 1 leased to both b and c"},
		{"two leases of one microshard of the epoch", []lease.Lease{a, mk("c", 0, 6)}, nil, "microshard 6 of epoch 0 leased to both a and c"},
		{"a candidate of the next epoch's lease not marked ahead", []lease.Lease{a, b}, []Candidate{cand(b, false)}, "candidate of b does not match its lease"},
		{"a candidate marked ahead on a lease of the epoch", []lease.Lease{a}, []Candidate{cand(a, true)}, "candidate of a does not match its lease"},
		{"a lease two epochs on", []lease.Lease{mk("c", 2, 0)}, nil, "is for epoch 2"},
		{"a candidate without its lease", []lease.Lease{a}, []Candidate{{Peer: "b", Lease: cid.Undef}}, "not in the round"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckLeases(baseID, base, tc.leases, tc.cands)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, lease.ErrInvalid)
			require.ErrorContains(t, err, tc.err)
		})
	}
}
