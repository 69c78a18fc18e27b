package gossip

import (
	"crypto/rand"
	"math"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/lease"
)

var (
	base  = cids.Record([]byte("base")).Bytes()
	delta = cids.Record([]byte("delta")).Bytes()
	lid   = cids.Record([]byte("lease")).Bytes()
)

func TestDecodersAcceptWhatEncodeWrites(t *testing.T) {
	a := &Announce{Experiment: "e", Peer: "p", Roles: []string{"trainer"}, Capacity: 12.5, Version: "v", Head: base, Round: 3, Time: 1,
		Started: 1700000000000, StepSeconds: 0.25}
	b, err := Encode(a)
	require.NoError(t, err)
	got, err := DecodeAnnounce(b)
	require.NoError(t, err)
	require.Equal(t, a, got)

	l := &Leases{Experiment: "e", Round: 2, Base: base, Issuer: "v", Deadline: 5,
		Leases: []lease.Lease{{Round: 2, Base: base, Trainer: "t", Microshards: []uint32{1}, Issuer: "v"}}}
	b, _ = Encode(l)
	gl, err := DecodeLeases(b)
	require.NoError(t, err)
	require.Equal(t, l, gl)

	c := &Contribution{Experiment: "e", Round: 2, Base: base, Lease: lid, Peer: "t", Delta: delta, Samples: 10, Loss: 0.5, Microshards: []uint32{1, 4},
		Seconds: 3, TrainSeconds: 2, FetchSeconds: 0.5}
	b, _ = Encode(c)
	gc, err := DecodeContribution(b)
	require.NoError(t, err)
	require.Equal(t, c, gc)

	r := &Release{Experiment: "e", Round: 2, Base: base, Lease: lid, Peer: "t", Reason: "worker exited"}
	b, _ = Encode(r)
	gr, err := DecodeRelease(b)
	require.NoError(t, err)
	require.Equal(t, r, gr)
}

func TestDecodersRejectBadMessages(t *testing.T) {
	enc := func(v any) []byte { b, _ := Encode(v); return b }
	cases := []struct {
		name string
		fn   func([]byte) error
		in   []byte
	}{
		{"announce not cbor", func(b []byte) error { _, err := DecodeAnnounce(b); return err }, []byte("hello")},
		{"announce no roles", func(b []byte) error { _, err := DecodeAnnounce(b); return err }, enc(&Announce{Peer: "p"})},
		{"announce negative step seconds", func(b []byte) error { _, err := DecodeAnnounce(b); return err },
			enc(&Announce{Peer: "p", Roles: []string{"trainer"}, StepSeconds: -1})},
		{"announce infinite step seconds", func(b []byte) error { _, err := DecodeAnnounce(b); return err },
			enc(&Announce{Peer: "p", Roles: []string{"trainer"}, StepSeconds: math.Inf(1)})},
		{"announce oversized", func(b []byte) error { _, err := DecodeAnnounce(b); return err }, make([]byte, MaxAnnounceBytes+1)},
		{"leases lease for other round", func(b []byte) error { _, err := DecodeLeases(b); return err },
			enc(&Leases{Round: 2, Base: base, Issuer: "v", Leases: []lease.Lease{{Round: 3, Base: base, Trainer: "t", Issuer: "v"}}})},
		{"leases two for one trainer", func(b []byte) error { _, err := DecodeLeases(b); return err },
			enc(&Leases{Round: 2, Base: base, Issuer: "v", Leases: []lease.Lease{{Round: 2, Base: base, Trainer: "t", Issuer: "v"}, {Round: 2, Base: base, Trainer: "t", Issuer: "v"}}})},
		{"contribution raw delta cid", func(b []byte) error { _, err := DecodeContribution(b); return err },
			enc(&Contribution{Round: 1, Base: base, Lease: lid, Peer: "t", Delta: cids.Raw([]byte("x")).Bytes()})},
		{"contribution unsorted shards", func(b []byte) error { _, err := DecodeContribution(b); return err },
			enc(&Contribution{Round: 1, Base: base, Lease: lid, Peer: "t", Delta: delta, Microshards: []uint32{3, 1}})},
		{"release without peer", func(b []byte) error { _, err := DecodeRelease(b); return err },
			enc(&Release{Round: 1, Base: base, Lease: lid})},
		{"release of round 0", func(b []byte) error { _, err := DecodeRelease(b); return err },
			enc(&Release{Base: base, Lease: lid, Peer: "t"})},
		{"release with a raw lease cid", func(b []byte) error { _, err := DecodeRelease(b); return err },
			enc(&Release{Round: 1, Base: base, Lease: cids.Raw([]byte("x")).Bytes(), Peer: "t"})},
		{"release with a long reason", func(b []byte) error { _, err := DecodeRelease(b); return err },
			enc(&Release{Round: 1, Base: base, Lease: lid, Peer: "t", Reason: string(make([]byte, MaxReleaseReason+1))})},
		{"release oversized", func(b []byte) error { _, err := DecodeRelease(b); return err }, make([]byte, MaxReleaseBytes+1)},
		{"unknown field", func(b []byte) error { _, err := DecodeContribution(b); return err }, enc(map[int]int{99: 1})},
		{"head garbage", func(b []byte) error { _, _, err := DecodeHead(b); return err }, []byte{0xff, 0x00}},
		{"contribution with negative fetch time", func(b []byte) error { _, err := DecodeContribution(b); return err },
			enc(&Contribution{Round: 1, Base: base, Lease: lid, Peer: "t", Delta: delta, FetchSeconds: -1})},
		{"head with notes for another round", func(b []byte) error { _, _, err := DecodeHead(b); return err }, func() []byte {
			k, _, err := crypto.GenerateEd25519Key(rand.Reader)
			require.NoError(t, err)
			m, id := signedHead(t, fixChainHead(2, 0), k)
			m.Notes = &chain.Notes{Round: 1, Seconds: 1}
			require.NoError(t, chain.SignNotes(k, id, m.Notes))
			return enc(m)
		}()},
		{"head with earlier notes without held-out metrics", func(b []byte) error { _, _, err := DecodeHead(b); return err },
			headWithEarlier(t, func(e *EarlierNotes, _ crypto.PrivKey) { e.Notes.HeldOut = nil })},
		{"head with earlier notes signed without held-out metrics", func(b []byte) error { _, _, err := DecodeHead(b); return err },
			headWithEarlier(t, func(e *EarlierNotes, k crypto.PrivKey) {
				resignEarlier(t, e, k, func(n *chain.Notes) { n.HeldOut = nil })
			})},
		{"head with earlier notes altered", func(b []byte) error { _, _, err := DecodeHead(b); return err },
			headWithEarlier(t, func(e *EarlierNotes, _ crypto.PrivKey) { e.Notes.HeldOut["loss"] = 0.1 })},
		{"head with earlier notes for another head", func(b []byte) error { _, _, err := DecodeHead(b); return err },
			headWithEarlier(t, func(e *EarlierNotes, _ crypto.PrivKey) { e.Head = base })},
		{"head with earlier notes of a raw cid", func(b []byte) error { _, _, err := DecodeHead(b); return err },
			headWithEarlier(t, func(e *EarlierNotes, _ crypto.PrivKey) { e.Head = cids.Raw([]byte("x")).Bytes() })},
		{"head with earlier notes of its own round", func(b []byte) error { _, _, err := DecodeHead(b); return err },
			headWithEarlier(t, func(e *EarlierNotes, k crypto.PrivKey) { resignEarlier(t, e, k, func(n *chain.Notes) { n.Round = 2 }) })},
		{"head with too many earlier notes", func(b []byte) error { _, _, err := DecodeHead(b); return err },
			headWithEarlier(t, func(e *EarlierNotes, _ crypto.PrivKey) {}, MaxEarlierNotes+1)},
		{"head with altered notes", func(b []byte) error { _, _, err := DecodeHead(b); return err }, func() []byte {
			k, _, err := crypto.GenerateEd25519Key(rand.Reader)
			require.NoError(t, err)
			m, _ := signedHead(t, fixChainHead(2, 0), k)
			m.Notes.HeldOut = map[string]float64{"accuracy": 1}
			return enc(m)
		}()},
		{"head with too many signatures", func(b []byte) error { _, _, err := DecodeHead(b); return err }, func() []byte {
			h, err := fixChainHead(1, 0).Encode()
			require.NoError(t, err)
			return enc(&Head{Experiment: "e", Signed: chain.SignedHead{Head: h, Sigs: make([]chain.Signature, MaxHeadSigs+1)}})
		}()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.fn(tc.in), ErrMalformed)
		})
	}
}

// headWithEarlier is an encoded round-2 head carrying the completed notes of n earlier
// heads (default 1), each changed by mend after signing.
func headWithEarlier(t *testing.T, mend func(e *EarlierNotes, k crypto.PrivKey), n ...int) []byte {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	m, _ := signedHead(t, fixChainHead(2, 0), k)
	count := 1
	if len(n) > 0 {
		count = n[0]
	}
	for range count {
		e := EarlierNotes{Head: cids.Record([]byte("round 1")).Bytes(), Notes: chain.Notes{Round: 1, HeldOut: map[string]float64{"loss": 2}}}
		id, _ := cid.Cast(e.Head)
		require.NoError(t, chain.SignNotes(k, id, &e.Notes))
		mend(&e, k)
		m.Earlier = append(m.Earlier, e)
	}
	b, err := Encode(m)
	require.NoError(t, err)
	return b
}

// resignEarlier changes e's notes and signs them again with k.
func resignEarlier(t *testing.T, e *EarlierNotes, k crypto.PrivKey, change func(*chain.Notes)) {
	t.Helper()
	change(&e.Notes)
	e.Notes.Sig = chain.Signature{}
	id, _ := cid.Cast(e.Head)
	require.NoError(t, chain.SignNotes(k, id, &e.Notes))
}

func TestDecodeHeadTakesEarlierNotes(t *testing.T) {
	b := headWithEarlier(t, func(*EarlierNotes, crypto.PrivKey) {}, MaxEarlierNotes)
	m, _, err := DecodeHead(b)
	require.NoError(t, err)
	require.Len(t, m.Earlier, MaxEarlierNotes)
	require.Equal(t, 2.0, m.Earlier[0].Notes.HeldOut["loss"])

	// Notes that say the evaluation failed complete a head's notes too.
	b = headWithEarlier(t, func(e *EarlierNotes, k crypto.PrivKey) {
		resignEarlier(t, e, k, func(n *chain.Notes) { n.HeldOut, n.HeldOutFailed = nil, true })
	})
	m, _, err = DecodeHead(b)
	require.NoError(t, err)
	require.True(t, m.Earlier[0].Notes.HeldOutFailed)
}

func FuzzDecoders(f *testing.F) {
	for _, v := range []any{
		&Announce{Experiment: "e", Peer: "p", Roles: []string{"trainer"}},
		&Contribution{Round: 1, Base: base, Lease: lid, Peer: "t", Delta: delta},
		&Leases{Round: 2, Base: base, Issuer: "v"},
		&Attestation{Head: base},
		&Release{Round: 1, Base: base, Lease: lid, Peer: "t"},
	} {
		b, _ := Encode(v)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = DecodeAnnounce(b)
		_, _ = DecodeLeases(b)
		_, _ = DecodeContribution(b)
		_, _, _ = DecodeHead(b)
		_, _ = DecodeAttestation(b)
		_, _ = DecodeRelease(b)
	})
}
