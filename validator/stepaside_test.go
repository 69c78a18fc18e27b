package validator

import (
	"log/slog"
	"sync"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/bus"
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
	v := newValidator(Params{Config: config.Default(), Log: slog.New(slog.DiscardHandler), Self: self, Sink: &testSink{},
		Validators: validators})
	v.quarantine = lease.NewQuarantine(1, 10, 5)
	r := newOpenRound(t.Context(), new(sync.WaitGroup), validators, self, base, head, 0)
	return v, r
}

func rejections(v *validator) map[string]uint64 {
	if r := v.Sink.(*testSink).snapshot().Rejections; r != nil {
		return r
	}
	return map[string]uint64{}
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
	grant := func(from string, ls ...lease.Lease) bus.Received[gossip.Leases] {
		return bus.Received[gossip.Leases]{From: from, Msg: &gossip.Leases{Round: round, Base: base.Bytes(), Issuer: from, Leases: ls}}
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
		before []bus.Received[gossip.Leases] // grants read before the contribution
		after  []bus.Received[gossip.Leases] // grants read after it, before the round ends here
		want   string                        // the verdict
		struck bool
	}{
		{"grant read before the contribution", []bus.Received[gossip.Leases]{grant("B", bLease)}, nil, ReasonForeignLease, false},
		{"grant read after the contribution", nil, []bus.Received[gossip.Leases]{grant("B", bLease)}, ReasonForeignLease, false},
		{"grant read after a heartbeat of its issuer", nil, []bus.Received[gossip.Leases]{grant("B"), grant("C"), grant("B", bLease)}, ReasonForeignLease, false},
		{"no grant names the lease", nil, []bus.Received[gossip.Leases]{grant("B")}, "no_lease", true},
		{"the lease is granted to another trainer", nil, []bus.Received[gossip.Leases]{grant("B", otherTrainer)}, "no_lease", true},
		{"the lease's grant comes from a peer that is not a validator", nil, []bus.Received[gossip.Leases]{grant("X", byX)}, "no_lease", true},
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
			v.accept(r, "t1", contribution(l))
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

// TestStaleForeignLeaseIsNoMiss: round 5 had two leaders: B stepped aside for C, whose
// head became canonical. Trainer t1 was still training B's lease of round 5 when the chain
// moved on, so the lease A granted it for round 6 expires while t1 reports B's. A trainer
// that did what a validator asked is not struck for that miss. Every other late report
// leaves the miss a strike: one on a lease of the round's proposer (its own lease, not
// merged: the trainer was slow), on a lease nobody granted, on a lease of another trainer,
// one read before round 6 opened here (it was free to train A's lease), or none.
func TestStaleForeignLeaseIsNoMiss(t *testing.T) {
	vs := []string{"A", "B", "C"}
	parent := cids.Record([]byte("head of round 4"))
	mk := func(issuer, trainer string) lease.Lease {
		return lease.Lease{Round: 5, Base: parent.Bytes(), Trainer: trainer, Microshards: []uint32{1}, Expiry: 1, Issuer: issuer}
	}
	byB, byC, merged := mk("B", "t1"), mk("C", "t1"), mk("C", "t2")
	h5 := &chain.Head{Round: 5, Parent: parent.Bytes(), Contributions: []chain.Contribution{{Peer: "t2", Lease: merged.ID().Bytes()}}}
	h5ID := cids.Record([]byte("head of round 5"))
	report := func(l lease.Lease) *gossip.Contribution {
		return &gossip.Contribution{Round: 5, Base: parent.Bytes(), Lease: l.ID().Bytes(), Peer: "t1",
			Delta: cids.Record([]byte("t1's late delta")).Bytes(), Microshards: l.Microshards, Samples: 8}
	}
	for _, tc := range []struct {
		name   string
		report *gossip.Contribution
		early  bool // read while round 5 was still open here
		struck bool
	}{
		{"report on the lease of a leader that stepped aside", report(byB), false, false},
		{"report on a lease of the round's proposer", report(byC), false, true},
		{"report on a lease nobody granted", report(mk("B", "t9")), false, true},
		{"report on another trainer's lease", report(merged), false, true},
		{"report read before the round opened here", report(byB), true, true},
		{"no report", nil, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, r := leadingValidator(t, "A", vs, 6, h5ID, h5)
			v.grants.record("B", &gossip.Leases{Round: 5, Base: parent.Bytes(), Issuer: "B", Leases: []lease.Lease{byB}})
			v.grants.record("C", &gossip.Leases{Round: 5, Base: parent.Bytes(), Issuer: "C", Leases: []lease.Lease{byC, merged}})
			if tc.report != nil && tc.early {
				v.noteReport("t1", tc.report, 5) // as follow reads it in round 5
			}
			v.forgetClosed(h5.Round) // round 6 opens here
			mine := lease.Lease{Round: 6, Base: h5ID.Bytes(), Trainer: "t1", Microshards: []uint32{2}, Expiry: 1, Issuer: "A"}
			r.leases[mine.ID()] = mine
			r.book.Grant([]lease.Lease{mine})
			require.False(t, v.quarantine.Miss("t1", 6), "one miss before: the next one quarantines")
			if tc.report != nil && !tc.early {
				v.accept(r, "t1", tc.report)
			}
			v.expire(r)
			require.Equal(t, tc.struck, v.quarantine.Quarantined("t1", 7), "the expired lease of round 6 struck t1")
			require.Empty(t, rejections(v), "a report for a closed round is not judged again")
		})
	}
}

// TestGrantLogTellsForeignLeases: a contribution's lease is another validator's when that
// validator granted it, to that trainer, for the same round on the same base; anything
// else (a lease of another round, base or trainer, a lease in a grant whose record names
// another issuer, an id nobody granted) is not, and strikes. A validator's own grants are
// recorded too (accept tells them apart: late, from before it stepped aside).
func TestGrantLogTellsForeignLeases(t *testing.T) {
	base := cids.Record([]byte("base"))
	other := cids.Record([]byte("other base"))
	mk := func(issuer, trainer string, round uint64, b cid.Cid) lease.Lease {
		return lease.Lease{Round: round, Base: b.Bytes(), Trainer: trainer, Microshards: []uint32{1, 2}, Expiry: 1, Issuer: issuer}
	}
	good := mk("B", "t1", 5, base)
	forgedIssuer := mk("C", "t2", 5, base) // in B's grant, naming C
	wrongRound := mk("B", "t3", 6, base)   // in B's grant of round 5
	own := mk("A", "t1", 5, base)          // this validator's own grant
	unknown := mk("B", "t9", 5, base)      // never granted
	otherBase := mk("B", "t4", 5, other)   // in B's grant on base
	g := newGrantLog()
	g.record("B", &gossip.Leases{Round: 5, Base: base.Bytes(), Issuer: "B",
		Leases: []lease.Lease{good, forgedIssuer, wrongRound, otherBase}})
	g.record("A", &gossip.Leases{Round: 5, Base: base.Bytes(), Issuer: "A", Leases: []lease.Lease{own}})
	g.record("C", &gossip.Leases{Round: 5, Base: base.Bytes(), Issuer: "B", Leases: []lease.Lease{mk("B", "t5", 5, base)}})
	for _, tc := range []struct {
		name    string
		round   uint64
		base    cid.Cid
		l       lease.Lease
		trainer string
		want    string
	}{
		{"granted by another validator", 5, base, good, "t1", "B"},
		{"claimed by another trainer", 5, base, good, "t2", ""},
		{"for another round", 6, base, good, "t1", ""},
		{"on another base", 5, other, good, "t1", ""},
		{"lease naming another issuer than its grant", 5, base, forgedIssuer, "t2", ""},
		{"lease of another round than its grant", 6, base, wrongRound, "t3", ""},
		{"lease on another base than its grant", 5, other, otherBase, "t4", ""},
		{"own grant", 5, base, own, "t1", "A"},
		{"never granted", 5, base, unknown, "t9", ""},
		{"grant published by another than its issuer", 5, base, mk("B", "t5", 5, base), "t5", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, g.issuer(tc.round, tc.base, tc.l.ID(), tc.trainer))
		})
	}
	g.prune(5)
	require.Empty(t, g.issuer(5, base, good.ID(), "t1"), "closed rounds are forgotten")
}
