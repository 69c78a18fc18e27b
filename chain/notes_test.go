package chain

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/stretchr/testify/require"
)

// Round notes are signed for one head: stored, served with the head over head sync, and
// refused when anything in them (or the head they are for) differs from what was signed.
func TestNotesAreSignedStoredAndSynced(t *testing.T) {
	st, err := OpenStore(t.TempDir())
	require.NoError(t, err)
	k, self := key(t)
	id := putSigned(t, st, k, testHead(0, nil))

	_, err = st.Notes(id)
	require.ErrorIs(t, err, ErrNotFound)
	n := &Notes{Round: 0, HeldOut: map[string]float64{"loss": 2.3, "accuracy": 0.1}, Rejected: 2,
		Seconds: 3, TrainSeconds: 1.5, CommSeconds: 0.5, MergeSeconds: 0.25,
		Rejections:  []Rejection{{Peer: "12D3KooWA", Reason: "norm_outlier"}, {Peer: "12D3KooWB", Reason: "late"}},
		Quarantined: []Quarantine{{Peer: "12D3KooWA", Until: 6}}}
	require.NoError(t, SignNotes(k, id, n))
	require.Equal(t, self, n.Sig.Peer)
	require.NoError(t, st.PutNotes(id, n))
	got, err := st.Notes(id)
	require.NoError(t, err)
	require.Equal(t, n, got)

	other := testHead(1, id.Bytes())
	otherID, err := other.ID()
	require.NoError(t, err)
	for name, bad := range map[string]func() (cid.Cid, *Notes){
		"another head": func() (cid.Cid, *Notes) { return otherID, got },
		"metric changed": func() (cid.Cid, *Notes) {
			c := *got
			c.HeldOut = map[string]float64{"loss": 0.1, "accuracy": 0.1}
			return id, &c
		},
		"rejections hidden": func() (cid.Cid, *Notes) { c := *got; c.Rejected, c.Rejections = 0, nil; return id, &c },
		"signer swapped":    func() (cid.Cid, *Notes) { c := *got; _, p := key(t); c.Sig.Peer = p; return id, &c },
		"reason changed": func() (cid.Cid, *Notes) {
			c := *got
			c.Rejections = []Rejection{{Peer: "12D3KooWA", Reason: "late"}, {Peer: "12D3KooWB", Reason: "late"}}
			return id, &c
		},
		"quarantine dropped": func() (cid.Cid, *Notes) { c := *got; c.Quarantined = nil; return id, &c },
	} {
		hid, bn := bad()
		require.ErrorIs(t, VerifyNotes(hid, bn), ErrBadSignature, name)
	}
	require.ErrorIs(t, SignNotes(k, id, &Notes{Seconds: -1}), ErrMalformed)
	require.ErrorIs(t, SignNotes(k, id, &Notes{HeldOut: map[string]float64{"loss": 1}, HeldOutDue: true}), ErrMalformed, "metrics given and due")
	require.ErrorIs(t, SignNotes(k, id, &Notes{HeldOutFailed: true, HeldOutDue: true}), ErrMalformed, "evaluation failed and due")
	require.ErrorIs(t, SignNotes(k, id, &Notes{HeldOutFailed: true, HeldOut: map[string]float64{"loss": 1}}), ErrMalformed, "evaluation failed and given")
	for name, bad := range map[string]*Notes{
		"more rejections listed than counted": {Rejected: 1, Rejections: []Rejection{{"a", "late"}, {"b", "late"}}},
		"rejection without a reason":          {Rejected: 1, Rejections: []Rejection{{"a", ""}}},
		"rejection without a peer":            {Rejected: 1, Rejections: []Rejection{{"", "late"}}},
		"quarantined twice":                   {Quarantined: []Quarantine{{"a", 3}, {"a", 4}}},
		"quarantined unsorted":                {Quarantined: []Quarantine{{"b", 3}, {"a", 4}}},
		"too many rejections":                 {Rejected: MaxNoteEntries + 1, Rejections: make([]Rejection, MaxNoteEntries+1)},
	} {
		require.ErrorIs(t, SignNotes(k, id, bad), ErrMalformed, name)
	}

	mn, err := mocknet.FullMeshConnected(2)
	require.NoError(t, err)
	t.Cleanup(func() { mn.Close() })
	server, client := mn.Hosts()[0], mn.Hosts()[1]
	svc := NewSyncService(server, st, func() cid.Cid { return id }, slog.New(slog.DiscardHandler), 0)
	t.Cleanup(svc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := RequestTip(ctx, client, server.ID())
	require.NoError(t, err)
	require.Equal(t, id, f.Signed.ID())
	require.Equal(t, n, f.Notes)
}

// TestTipsCompleteNotes: a head's notes are kept as first heard, except that notes whose
// held-out metrics are due give way to the same signer's notes that carry them, or that say
// the evaluation failed (a leader publishes its head before it evaluates it); NotesChanged
// fires when notes are kept.
func TestTipsCompleteNotes(t *testing.T) {
	k, self := key(t)
	k2, other := key(t)
	h := testHead(1, nil)
	id, err := h.ID()
	require.NoError(t, err)
	signed := func(k crypto.PrivKey, held map[string]float64, rejected uint64) *Notes {
		n := &Notes{Round: 1, HeldOut: held, Rejected: rejected, Seconds: 2, HeldOutDue: held == nil}
		require.NoError(t, SignNotes(k, id, n))
		return n
	}
	bare := signed(k, nil, 1)
	none := &Notes{Round: 1, Rejected: 1, Seconds: 2} // no evaluation due
	require.NoError(t, SignNotes(k, id, none))
	full := signed(k, map[string]float64{"loss": 2}, 1)
	failed := &Notes{Round: 1, Rejected: 1, Seconds: 2, HeldOutFailed: true} // the evaluation failed
	require.NoError(t, SignNotes(k, id, failed))
	failedOther := &Notes{Round: 1, Rejected: 1, Seconds: 2, HeldOutFailed: true}
	require.NoError(t, SignNotes(k2, id, failedOther))
	cases := []struct {
		name   string
		first  *Notes
		then   *Notes
		want   *Notes
		change bool // the second SetNotes keeps its notes
	}{
		{"completed by the signer", bare, full, full, true},
		{"complete notes stay", full, signed(k, map[string]float64{"loss": 1}, 1), full, false},
		{"not completed by another validator", bare, signed(k2, map[string]float64{"loss": 1}, 1), bare, false},
		{"bare notes do not replace complete ones", full, bare, full, false},
		{"bare notes do not replace bare ones", bare, signed(k, nil, 5), bare, false},
		{"notes with no evaluation due stay", none, full, none, false},
		{"ended by the signer's failed evaluation", bare, failed, failed, true},
		{"not ended by another validator's", bare, failedOther, bare, false},
		{"a failed evaluation stays", failed, full, failed, false},
		{"a failed evaluation does not replace metrics", full, failed, full, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := OpenStore(t.TempDir())
			require.NoError(t, err)
			tips := NewTips(st, []string{self, other}, 1)
			require.NoError(t, tips.SetNotes(id, 1, tc.first))
			changed := tips.NotesChanged()
			require.NoError(t, tips.SetNotes(id, 1, tc.then))
			require.Equal(t, tc.want, tips.Notes(id))
			got, err := st.Notes(id)
			require.NoError(t, err)
			require.Equal(t, tc.want, got, "the notes stored beside the head")
			select {
			case <-changed:
				require.True(t, tc.change, "NotesChanged fired")
			default:
				require.False(t, tc.change, "NotesChanged did not fire")
			}
			// A restarted node reads the stored notes back, and completes them the same way.
			again := NewTips(st, []string{self, other}, 1)
			require.NoError(t, again.SetNotes(id, 1, full))
			if tc.want.HeldOutDue {
				require.Equal(t, full, again.Notes(id))
			}
		})
	}
}

// FuzzDecodeNotes: notes come from any peer with the chain; whatever decodes is well formed
// and encodes to notes that decode and encode to the same bytes.
func FuzzDecodeNotes(f *testing.F) {
	for _, n := range []*Notes{
		{Round: 3, HeldOut: map[string]float64{"loss": 1.5}, Rejected: 2, Seconds: 4,
			Rejections:  []Rejection{{Peer: "12D3KooWA", Reason: "norm_outlier"}, {Peer: "12D3KooWA", Reason: "late"}},
			Quarantined: []Quarantine{{Peer: "12D3KooWA", Until: 8}, {Peer: "12D3KooWB", Until: 9}}},
		{Round: 1, HeldOutDue: true},
	} {
		b, err := Marshal(n)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := DecodeNotes(b)
		if err != nil {
			return
		}
		require.NoError(t, n.check())
		again, err := Marshal(n)
		require.NoError(t, err)
		m, err := DecodeNotes(again)
		require.NoError(t, err)
		third, err := Marshal(m)
		require.NoError(t, err)
		require.Equal(t, again, third)
	})
}
