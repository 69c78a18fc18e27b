package chain

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/stretchr/testify/require"
)

// Round notes are signed for one head: stored, served with the head over head sync, and
// refused when anything in them (or the head they are for) differs from what was signed.
func TestNotesAreSignedStoredAndSynced(t *testing.T) {
	st, err := OpenStore(t.TempDir())
	require.NoError(t, err)
	k, self := key(t)
	h := testHead(0, nil)
	b, err := h.Encode()
	require.NoError(t, err)
	id, err := h.ID()
	require.NoError(t, err)
	sig, err := Sign(k, id)
	require.NoError(t, err)
	_, err = st.Put(&SignedHead{Head: b, Sigs: []Signature{sig}})
	require.NoError(t, err)

	_, err = st.Notes(id)
	require.ErrorIs(t, err, ErrNotFound)
	n := &Notes{Round: 0, HeldOut: map[string]float64{"loss": 2.3, "accuracy": 0.1}, Rejected: 2,
		Seconds: 3, TrainSeconds: 1.5, CommSeconds: 0.5, MergeSeconds: 0.25}
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
		"rejections hidden": func() (cid.Cid, *Notes) { c := *got; c.Rejected = 0; return id, &c },
		"signer swapped":    func() (cid.Cid, *Notes) { c := *got; _, p := key(t); c.Sig.Peer = p; return id, &c },
	} {
		hid, bn := bad()
		require.ErrorIs(t, VerifyNotes(hid, bn), ErrBadSignature, name)
	}
	require.ErrorIs(t, SignNotes(k, id, &Notes{Seconds: -1}), ErrMalformed)

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
