package chain

import (
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/cids"
)

func testHead(round uint64, parent []byte) *Head {
	h := &Head{
		Version: 1, Network: "net", Experiment: "exp", Round: round, Parent: parent,
		Params:     cids.Record([]byte{byte(round)}).Bytes(),
		LayoutHash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		Policy:     Policy{Kind: "diloco", OuterLR: 0.7, Momentum: 0.9, Nesterov: true, Aggregator: "mean", Codec: "fp32"},
		Ledger:     Ledger{Plan: "plan", Shards: 10, Consumed: make([]byte, 2)},
	}
	if round > 0 {
		h.Contributions = []Contribution{
			{Peer: "a", Artifact: cids.Record([]byte("da")).Bytes(), Samples: 10, Weight: 10, Microshards: []uint32{1, 2}, Loss: 0.5},
			{Peer: "b", Artifact: cids.Record([]byte("db")).Bytes(), Samples: 20, Weight: 20, Microshards: []uint32{3}, Loss: 0.25},
		}
	}
	return h
}

func key(t *testing.T) (crypto.PrivKey, string) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	id, err := peer.IDFromPrivateKey(k)
	require.NoError(t, err)
	return k, id.String()
}

// putSigned stores h signed by k and returns its CID.
func putSigned(t *testing.T, st *Store, k crypto.PrivKey, h *Head) cid.Cid {
	t.Helper()
	b, err := h.Encode()
	require.NoError(t, err)
	id, err := h.ID()
	require.NoError(t, err)
	sig, err := Sign(k, id)
	require.NoError(t, err)
	_, err = st.Put(&SignedHead{Head: b, Sigs: []Signature{sig}})
	require.NoError(t, err)
	return id
}

func TestHeadEncodingIsCanonical(t *testing.T) {
	h := testHead(0, nil)
	b1, err := h.Encode()
	require.NoError(t, err)
	d, err := DecodeHead(b1)
	require.NoError(t, err)
	b2, err := d.Encode()
	require.NoError(t, err)
	require.Equal(t, b1, b2, "decode+encode is the identity")
	id1, _ := h.ID()
	id2, _ := d.ID()
	require.True(t, id1.Equals(id2))
	h.Round = 7
	h.Parent = id1.Bytes()
	id3, _ := h.ID()
	require.False(t, id1.Equals(id3))
}

func TestHeadValidate(t *testing.T) {
	parent := cids.Record([]byte("parent")).Bytes()
	cases := map[string]func(h *Head){
		"version":             func(h *Head) { h.Version = 2 },
		"genesis with parent": func(h *Head) { h.Round = 0 },
		"no parent":           func(h *Head) { h.Parent = nil },
		"params raw cid":      func(h *Head) { h.Params = cids.Raw([]byte("x")).Bytes() },
		"layout hash":         func(h *Head) { h.LayoutHash = "short" },
		"unsorted peers":      func(h *Head) { h.Contributions[0].Peer = "z" },
		"zero weight":         func(h *Head) { h.Contributions[1].Weight = 0 },
		"unsorted shards":     func(h *Head) { h.Contributions[0].Microshards = []uint32{2, 1} },
		"bitmap size":         func(h *Head) { h.Ledger.Consumed = []byte{0} },
	}
	require.NoError(t, testHead(3, parent).Validate())
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			h := testHead(3, parent)
			mutate(h)
			require.ErrorIs(t, h.Validate(), ErrMalformed)
		})
	}
}

func TestSignaturesAndQuorum(t *testing.T) {
	k1, p1 := key(t)
	k2, p2 := key(t)
	k3, _ := key(t)
	h := testHead(0, nil)
	b, _ := h.Encode()
	id, _ := h.ID()
	sh := &SignedHead{Head: b}
	s1, err := Sign(k1, id)
	require.NoError(t, err)
	require.NoError(t, VerifySignature(id, s1))
	require.True(t, sh.Add(s1))
	require.False(t, sh.Add(s1), "one signature per peer")

	_, err = sh.Quorum([]string{p1, p2}, 2)
	require.ErrorIs(t, err, ErrBadSignature)
	s2, _ := Sign(k2, id)
	sh.Add(s2)
	n, err := sh.Quorum([]string{p1, p2}, 2)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	s3, _ := Sign(k3, id)
	sh.Add(s3)
	n, _ = sh.Quorum([]string{p1, p2}, 2)
	require.Equal(t, 2, n, "signers outside the validator set do not count")

	forged := Signature{Peer: p2, Sig: s1.Sig}
	require.ErrorIs(t, VerifySignature(id, forged), ErrBadSignature)
	other, _ := testHead(1, id.Bytes()).ID()
	require.ErrorIs(t, VerifySignature(other, s1), ErrBadSignature, "a signature covers one head")
}

func TestStoreWalksTheChain(t *testing.T) {
	st, err := OpenStore(t.TempDir())
	require.NoError(t, err)
	k, p := key(t)
	var parent []byte
	var ids []string
	for r := uint64(0); r < 4; r++ {
		id := putSigned(t, st, k, testHead(r, parent))
		parent = id.Bytes()
		ids = append(ids, id.String())
	}
	tip, _ := testHead(3, nil).ID()
	_ = tip
	last, err := castOptional(parent, "tip")
	require.NoError(t, err)
	got, heads, err := st.Chain(last)
	require.NoError(t, err)
	require.Len(t, heads, 4)
	for i, id := range got {
		require.Equal(t, ids[i], id.String())
		require.Equal(t, uint64(i), heads[i].Round)
	}
	sh, _, err := st.Get(last)
	require.NoError(t, err)
	n, err := sh.Quorum([]string{p}, 1)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	_, _, err = st.Get(cids.Record([]byte("nope")))
	require.ErrorIs(t, err, ErrNotFound)
}

func FuzzDecodeSigned(f *testing.F) {
	h := testHead(1, cids.Record([]byte("p")).Bytes())
	b, _ := h.Encode()
	good, _ := EncodeSigned(&SignedHead{Head: b, Sigs: []Signature{{Peer: "x", Sig: []byte{1}}}})
	f.Add(good)
	f.Add(b)
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, data []byte) {
		sh, h, err := DecodeSigned(data)
		if err != nil {
			return
		}
		require.NoError(t, h.Validate())
		again, err := EncodeSigned(sh)
		require.NoError(t, err)
		_, _, err = DecodeSigned(again)
		require.NoError(t, err)
	})
}

// TestHeadsWithoutScreenStatsStillDecode: heads made before Metrics carried screening
// statistics (metrics map {1: loss, 2: samples}) decode as "no history" and re-encode to
// the same bytes, so their CIDs are unchanged; heads with statistics round-trip.
func TestHeadsWithoutScreenStatsStillDecode(t *testing.T) {
	type oldMetrics struct {
		TrainLoss float64 `cbor:"1,keyasint"`
		Samples   uint64  `cbor:"2,keyasint"`
	}
	old := testHead(3, cids.Record([]byte("parent")).Bytes())
	old.Metrics = Metrics{TrainLoss: 0.75, Samples: 30}
	b, err := old.Encode()
	require.NoError(t, err)
	m, err := Marshal(oldMetrics{TrainLoss: 0.75, Samples: 30})
	require.NoError(t, err)
	require.Contains(t, string(b), string(m), "a head without statistics encodes its metrics as before")
	d, err := DecodeHead(b)
	require.NoError(t, err)
	require.Nil(t, d.Metrics.Screen)
	again, err := d.Encode()
	require.NoError(t, err)
	require.Equal(t, b, again)

	old.Metrics.Screen = &ScreenStats{Rounds: 6, Norm: 1.5, CohortN: 6, CohortMean: 0.2, CohortVar: 0.01, RefN: 5, RefMean: 0.1, RefVar: 0.002}
	b, err = old.Encode()
	require.NoError(t, err)
	d, err = DecodeHead(b)
	require.NoError(t, err)
	require.Equal(t, old.Metrics, d.Metrics)
}

func TestStoreRecentMerges(t *testing.T) {
	st, err := OpenStore(t.TempDir())
	require.NoError(t, err)
	k, _ := key(t)
	// Round r merges these peers, each with a delta of its own.
	merged := [][]string{nil, {"a", "b"}, {"a"}, {"a", "c"}}
	delta := func(r int, p string) cid.Cid { return cids.Record([]byte(fmt.Sprintf("delta %d %s", r, p))) }
	var parent []byte
	var tip cid.Cid
	for r, peers := range merged {
		h := testHead(uint64(r), parent)
		h.Contributions = nil
		for _, p := range peers {
			h.Contributions = append(h.Contributions, Contribution{Peer: p, Artifact: delta(r, p).Bytes(), Samples: 1, Weight: 1, Microshards: []uint32{uint32(r)}})
		}
		id := putSigned(t, st, k, h)
		parent, tip = id.Bytes(), id
	}
	for _, tc := range []struct {
		name   string
		tip    cid.Cid
		n      int
		deltas []cid.Cid
		merges map[string]int
	}{
		{"the tip only", tip, 1, []cid.Cid{delta(3, "a"), delta(3, "c")}, map[string]int{"a": 1, "c": 1}},
		{"two heads", tip, 2, []cid.Cid{delta(3, "a"), delta(3, "c"), delta(2, "a")}, map[string]int{"a": 2, "c": 1}},
		{"past genesis", tip, 64, []cid.Cid{delta(3, "a"), delta(3, "c"), delta(2, "a"), delta(1, "a"), delta(1, "b")}, map[string]int{"a": 3, "b": 1, "c": 1}},
		{"unknown tip", cids.Record([]byte("nope")), 64, nil, map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deltas, merges := st.RecentMerges(tc.tip, tc.n)
			want := map[cid.Cid]bool{}
			for _, d := range tc.deltas {
				want[d] = true
			}
			require.Equal(t, want, deltas)
			require.Equal(t, tc.merges, merges)
		})
	}
}
