package gossip

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/lease"
)

// The largest messages a fleet can produce, built from the bounds the node keeps: a round
// leases at most lease.MaxRoundMicroshards microshards, a lease at most
// lease.MaxLeaseMicroshards; ids, names and numbers take their longest encodings.
const (
	worstTrainers = 64
	// worstPlan is the largest dataset plan we size the ledger for: a microshard holds at
	// least one manifest file, and a manifest (dataset.MaxManifestBytes, 256 MiB) lists about
	// two million files at the smallest entry; 2^22 leaves room. Its ledger bitmap is 512 KiB.
	worstPlan = 1 << 22
	// worstSigs is the most signatures a head may carry (MaxHeadSigs).
	worstSigs = MaxHeadSigs
)

// worstPeers returns n Ed25519 peer ids (the node's identity type), as sorted strings (a
// head lists its contributions in peer order).
func worstPeers(t *testing.T, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		seed := make([]byte, 64)
		seed[0], seed[1], seed[2] = 'w', byte(i), byte(i>>8)
		sk, _, err := crypto.GenerateEd25519Key(bytes.NewReader(seed))
		require.NoError(t, err)
		id, err := peer.IDFromPrivateKey(sk)
		require.NoError(t, err)
		out[i] = id.String()
	}
	slices.Sort(out)
	return out
}

// worstShares splits total microshards among n lists of at most per each, with ids at the
// top of a worstPlan-sized plan (5 bytes each in CBOR, the most a plan of this size costs).
func worstShares(n, total, per int) [][]uint32 {
	out := make([][]uint32, n)
	id := uint32(worstPlan - total)
	for i := range out {
		k := min(per, total/n+boolInt(i < total%n))
		for range k {
			out[i] = append(out[i], id)
			id++
		}
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func worstCID(what string, i int) []byte {
	return cids.Record(fmt.Appendf(nil, "%s %d", what, i)).Bytes()
}

// TestWorstCaseMessagesFitTheirTopics builds the largest message of every topic at 64
// trainers and a round leasing lease.MaxRoundMicroshards microshards (the worst case of
// "thousands"), encodes it, checks its size against the topic's bound and that the
// topic's decoder accepts it (validation stays strict: the bounds are what the node
// produces, nothing more).
func TestWorstCaseMessagesFitTheirTopics(t *testing.T) {
	peers := worstPeers(t, worstTrainers)
	validators := worstPeers(t, worstSigs+worstTrainers)[worstTrainers:]
	issuer := validators[0]
	name := strings.Repeat("x", 64) // experiment and network ids are at most 64 characters
	base := worstCID("base", 0)
	shares := worstShares(worstTrainers, lease.MaxRoundMicroshards, lease.MaxLeaseMicroshards)
	leases := make([]lease.Lease, worstTrainers)
	for i := range leases {
		// Each lease reserves its last microshard for the next round (protocol.overlap:
		// eager): a reservation counts toward the round's bound, and costs its own fields.
		n := len(shares[i]) - 1
		leases[i] = lease.Lease{Round: math.MaxUint64, Base: base, Trainer: peers[i], Microshards: shares[i][:n],
			Expiry: math.MaxInt64, Issuer: issuer, Epoch: math.MaxUint64, Steps: math.MaxUint32, Next: shares[i][n:], NextSteps: math.MaxUint32}
	}
	grant := &Leases{Experiment: name, Round: math.MaxUint64, Base: base, Issuer: issuer, Deadline: math.MaxInt64,
		Leases: leases, Attempt: math.MaxUint64}

	// One trainer's contribution at the most one lease grants.
	fullLease := worstShares(1, lease.MaxLeaseMicroshards, lease.MaxLeaseMicroshards)[0]
	contrib := &Contribution{Experiment: name, Round: math.MaxUint64, Base: base, Lease: worstCID("lease", 0), Peer: peers[0],
		Delta: worstCID("delta", 0), Samples: math.MaxUint64, Loss: math.Pi, Microshards: fullLease, Seconds: math.Pi}

	// The proposal of such a round: every trainer merged, its lease and candidate listed.
	h := &chain.Head{Version: 1, Network: name, Experiment: name, Round: math.MaxUint64, Parent: worstCID("parent", 0),
		Params: worstCID("params", 0), OuterState: worstCID("outer", 0), LayoutHash: strings.Repeat("ab", 32),
		Policy: chain.Policy{Kind: "diloco", OuterLR: math.Pi, Momentum: math.Pi, Nesterov: true, NewWeight: math.Pi,
			Aggregator: "coordinate_median", Codec: "sparse"},
		Metrics: chain.Metrics{TrainLoss: math.Pi, Samples: math.MaxUint64, Screen: &chain.ScreenStats{Rounds: math.MaxUint64,
			Norm: math.Pi, CohortN: math.MaxUint64, CohortMean: math.Pi, CohortVar: math.Pi, RefN: math.MaxUint64, RefMean: math.Pi, RefVar: math.Pi}},
		Ledger: chain.Ledger{Plan: cids.Record([]byte("plan")).String(), Shards: worstPlan, Epoch: math.MaxUint64,
			Consumed: bytes.Repeat([]byte{0xff}, worstPlan/8)}}
	var cands []Candidate
	for i, p := range peers {
		h.Contributions = append(h.Contributions, chain.Contribution{Peer: p, Artifact: worstCID("delta", i), Lease: worstCID("lease", i),
			Samples: math.MaxUint64, Weight: math.Pi, Microshards: shares[i], Loss: math.Pi})
		cands = append(cands, Candidate{Peer: p, Delta: worstCID("delta", i), Lease: worstCID("lease", i), Samples: math.MaxUint64,
			Microshards: shares[i], Loss: math.Pi})
	}
	enc, err := h.Encode()
	require.NoError(t, err)
	require.LessOrEqual(t, len(enc), chain.MaxHeadBytes, "the head record itself")
	sigs := make([]chain.Signature, worstSigs)
	for i := range sigs {
		sigs[i] = chain.Signature{Peer: validators[i], Sig: bytes.Repeat([]byte{0xaa}, 64)}
	}
	// The proposer's notes (held-out metrics, timings) ride along signed; the decoder holds
	// them to chain.MaxNotesBytes, which the size check below adds instead of building them.
	head := &Head{Experiment: name, Signed: chain.SignedHead{Head: enc, Sigs: sigs},
		Proposal: &Proposal{Attempt: math.MaxUint64, Leases: leases, Candidates: cands}, Sent: math.MaxInt64}

	announce := &Announce{Experiment: name, Peer: peers[0], Roles: []string{"validator", "trainer", "bootstrap"}, Capacity: math.Pi,
		Version: strings.Repeat("v", 64), Head: worstCID("head", 0), Round: math.MaxUint64, Time: math.MaxInt64,
		Started: math.MaxInt64, StepSeconds: math.Pi}
	for i := range 64 {
		announce.Artifacts = append(announce.Artifacts, worstCID("artifact", i))
	}
	attest := &Attestation{Experiment: name, Head: worstCID("head", 0), Round: math.MaxUint64, Sent: math.MaxInt64,
		Sig: chain.Signature{Peer: issuer, Sig: bytes.Repeat([]byte{0xaa}, 64)}}
	release := &Release{Experiment: name, Round: math.MaxUint64, Base: base, Lease: worstCID("lease", 0), Peer: peers[0],
		Reason: strings.Repeat("r", MaxReleaseReason)}

	cases := []struct {
		msg    any
		extra  int // bytes of bounded parts not built (the head's notes)
		decode func([]byte) error
	}{
		{grant, 0, func(b []byte) error { _, err := DecodeLeases(b); return err }},
		{contrib, 0, func(b []byte) error { _, err := DecodeContribution(b); return err }},
		{head, chain.MaxNotesBytes, func(b []byte) error { _, _, err := DecodeHead(b); return err }},
		{announce, 0, func(b []byte) error { _, err := DecodeAnnounce(b); return err }},
		{attest, 0, func(b []byte) error { _, err := DecodeAttestation(b); return err }},
		{release, 0, func(b []byte) error { _, err := DecodeRelease(b); return err }},
	}
	for _, tc := range cases {
		k, err := kindOf(tc.msg)
		require.NoError(t, err)
		t.Run(string(k), func(t *testing.T) {
			b, err := Encode(tc.msg)
			require.NoError(t, err)
			n := len(b) + tc.extra
			t.Logf("%-13s worst case %8d bytes, bound %8d (%4.1f %%)", k, n, k.maxBytes(), 100*float64(n)/float64(k.maxBytes()))
			require.LessOrEqual(t, n, k.maxBytes(), "%s message at %d trainers", k, worstTrainers)
			require.NoError(t, tc.decode(b), "the decoder accepts the largest message the node makes")
		})
	}
}

// Lists beyond the lease package's bounds are no message a node makes: the decoders reject
// them before anyone acts on them.
func TestDecodersRejectMicroshardsBeyondTheBounds(t *testing.T) {
	enc := func(v any) []byte { b, err := Encode(v); require.NoError(t, err); return b }
	long := make([]uint32, lease.MaxLeaseMicroshards+1)
	for i := range long {
		long[i] = uint32(i)
	}
	// MaxRoundMicroshards+1 over leases each within the per-lease bound.
	var spread []lease.Lease
	for i, s := range worstShares(lease.MaxRoundMicroshards/lease.MaxLeaseMicroshards+1, lease.MaxRoundMicroshards+1, lease.MaxLeaseMicroshards) {
		spread = append(spread, lease.Lease{Round: 2, Base: base, Trainer: fmt.Sprintf("t%d", i), Microshards: s, Issuer: "v"})
	}
	h, err := fixChainHead(2, 0).Encode()
	require.NoError(t, err)
	cases := []struct {
		name string
		fn   func() error
	}{
		{"lease too long", func() error {
			_, err := DecodeLeases(enc(&Leases{Round: 2, Base: base, Issuer: "v", Leases: []lease.Lease{{Round: 2, Base: base, Trainer: "t", Microshards: long, Issuer: "v"}}}))
			return err
		}},
		{"grant over the round bound", func() error {
			_, err := DecodeLeases(enc(&Leases{Round: 2, Base: base, Issuer: "v", Leases: spread}))
			return err
		}},
		{"reservation too long", func() error {
			_, err := DecodeLeases(enc(&Leases{Round: 2, Base: base, Issuer: "v", Leases: []lease.Lease{{Round: 2, Base: base, Trainer: "t", Microshards: []uint32{0}, Next: long, NextSteps: 1, Issuer: "v"}}}))
			return err
		}},
		{"grant over the round bound with its reservations", func() error {
			half := slices.Clone(spread)
			for i := range half {
				n := len(half[i].Microshards) / 2
				half[i].Microshards, half[i].Next, half[i].NextSteps = half[i].Microshards[:n], half[i].Microshards[n:], 1
			}
			_, err := DecodeLeases(enc(&Leases{Round: 2, Base: base, Issuer: "v", Leases: half}))
			return err
		}},
		{"contribution too long", func() error {
			_, err := DecodeContribution(enc(&Contribution{Round: 2, Base: base, Lease: lid, Peer: "t", Delta: delta, Microshards: long}))
			return err
		}},
		{"proposal lease too long", func() error {
			_, _, err := DecodeHead(enc(&Head{Experiment: "e", Signed: chain.SignedHead{Head: h},
				Proposal: &Proposal{Leases: []lease.Lease{{Round: 2, Base: base, Trainer: "t", Microshards: long, Issuer: "v"}}}}))
			return err
		}},
		{"proposal candidates over the round bound", func() error {
			var cs []Candidate
			for _, l := range spread {
				cs = append(cs, Candidate{Peer: l.Trainer, Delta: delta, Lease: lid, Microshards: l.Microshards})
			}
			_, _, err := DecodeHead(enc(&Head{Experiment: "e", Signed: chain.SignedHead{Head: h}, Proposal: &Proposal{Candidates: cs}}))
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.fn(), ErrMalformed)
		})
	}
}
