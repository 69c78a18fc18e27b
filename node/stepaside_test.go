package node

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// leadingValidator is validator self of validators, leading round on base, with a
// quarantine that one hard strike (or two misses) puts a trainer in: a test sees a strike
// as a quarantined trainer.
func leadingValidator(t *testing.T, self string, validators []string, round uint64, base cid.Cid, head *chain.Head) (*validator, *openRound) {
	t.Helper()
	e := &env{cfg: config.Default(), log: slog.New(slog.DiscardHandler), self: self, status: &statusBoard{},
		metrics: newNodeMetrics(prometheus.NewRegistry()), validators: validators}
	v := newValidator(e, nil)
	v.quarantine = lease.NewQuarantine(1, 10, 5)
	r := &openRound{round: round, baseID: base, base: head, received: map[string]received{}, book: lease.NewBook(round, time.Now()),
		returns: map[string]int{}, order: lease.Leaders(validators, base), foreign: map[string]bool{}, leases: map[cid.Cid]lease.Lease{},
		held: map[heldKey]string{}}
	r.rank = slices.Index(r.order, self)
	return v, r
}

func rejections(v *validator) map[string]uint64 {
	st := v.status.Snapshot()
	if st.Validator == nil {
		return map[string]uint64{}
	}
	return st.Validator.Rejections
}

// TestForeignLeaseHeardAfterItsContribution: the new leader of a round (A) can read a
// contribution made under another validator's lease (B's) before B's grant that carried
// the lease: B's grants reach A late, which is why A took the round over. That contribution
// is no trainer's fault and must not strike it; a contribution under a lease that no
// validator granted that trainer for the round still strikes (no_lease) by the round's end
// here. A grant is believed only from the validator it names (gossip checks the signature
// of its publisher; recordGrant checks that it is a validator).
func TestForeignLeaseHeardAfterItsContribution(t *testing.T) {
	const round = 7
	base := cids.Record([]byte("base of round 7"))
	vs := []string{"A", "B", "C"}
	bLease := lease.Lease{Round: round, Base: base.Bytes(), Trainer: "t1", Microshards: []uint32{3, 4}, Expiry: 1, Issuer: "B"}
	grant := func(from string, ls ...lease.Lease) Received[gossip.Leases] {
		return Received[gossip.Leases]{From: from, Msg: &gossip.Leases{Round: round, Base: base.Bytes(), Issuer: from, Leases: ls}}
	}
	contribution := func(l lease.Lease) *gossip.Contribution {
		return &gossip.Contribution{Round: round, Base: base.Bytes(), Lease: l.ID().Bytes(), Peer: "t1",
			Delta: cids.Record([]byte("delta of t1")).Bytes(), Microshards: l.Microshards, Samples: 8}
	}
	otherTrainer := bLease
	otherTrainer.Trainer = "t2"
	byX := bLease
	byX.Issuer = "X"
	for _, tc := range []struct {
		name   string
		before []Received[gossip.Leases] // grants read before the contribution
		after  []Received[gossip.Leases] // grants read after it, before the round ends here
		want   string                    // the verdict
		struck bool
	}{
		{"grant read before the contribution", []Received[gossip.Leases]{grant("B", bLease)}, nil, reasonForeignLease, false},
		{"grant read after the contribution", nil, []Received[gossip.Leases]{grant("B", bLease)}, reasonForeignLease, false},
		{"grant read after a heartbeat of its issuer", nil, []Received[gossip.Leases]{grant("B"), grant("C"), grant("B", bLease)}, reasonForeignLease, false},
		{"no grant names the lease", nil, []Received[gossip.Leases]{grant("B")}, "no_lease", true},
		{"the lease is granted to another trainer", nil, []Received[gossip.Leases]{grant("B", otherTrainer)}, "no_lease", true},
		{"the lease's grant comes from a peer that is not a validator", nil, []Received[gossip.Leases]{grant("X", byX)}, "no_lease", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, r := leadingValidator(t, "A", vs, round, base, &chain.Head{Round: round - 1})
			for _, g := range tc.before {
				v.grantHeard(r, g)
			}
			l := bLease
			if len(tc.after) > 0 && tc.after[len(tc.after)-1].From == "X" {
				l = byX
			}
			v.accept(t.Context(), r, "t1", contribution(l))
			for _, g := range tc.after {
				v.grantHeard(r, g)
			}
			v.settleHeld(r, true) // the round ends here
			got := rejections(v)
			require.Equal(t, map[string]uint64{tc.want: 1}, got, "one verdict on the contribution")
			require.Equal(t, tc.struck, v.quarantine.Quarantined("t1", round+1), "strike toward quarantine")
			require.Empty(t, r.received, "a contribution under another's lease is never merged here")
		})
	}
}
