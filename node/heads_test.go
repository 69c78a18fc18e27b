package node

import (
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/status"
)

// TestLateNotesCompleteTheRecordedHistory: rounds 1 to 3 are recorded with notes that
// lack held-out metrics (synced before their leader evaluated them). When round 1's
// completed notes come, its history point takes them and the metrics get a progress line
// of their own; round 2's come next. Round 3's leader says its evaluation failed: its
// point and a line say so, and the watcher stops waiting for its metrics.
func TestLateNotesCompleteTheRecordedHistory(t *testing.T) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	self, err := peer.IDFromPrivateKey(k)
	require.NoError(t, err)
	heads, err := chain.OpenStore(t.TempDir())
	require.NoError(t, err)
	tips := chain.NewTips(heads, []string{self.String()}, 1)
	var out strings.Builder
	cfg := config.Default()
	cfg.Node.StoreDir = t.TempDir()
	w := &watcher{env: &env{cfg: cfg, heads: heads, tips: tips, status: &status.Board{}, metrics: status.NewMetrics(prometheus.NewRegistry()), progress: &out}}

	var ids []cid.Cid
	parent := cid.Undef
	for r := uint64(0); r <= 3; r++ {
		h := &chain.Head{Version: 1, Network: "net", Experiment: "exp", Round: r,
			Params: cids.Record([]byte{byte(r)}).Bytes(), LayoutHash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			Ledger: chain.Ledger{Plan: "plan", Shards: 8, Consumed: make([]byte, 1)}, Metrics: chain.Metrics{TrainLoss: 1}}
		if parent.Defined() {
			h.Parent = parent.Bytes()
		}
		b, err := h.Encode()
		require.NoError(t, err)
		id, err := h.ID()
		require.NoError(t, err)
		sig, err := chain.Sign(k, id)
		require.NoError(t, err)
		ok, err := tips.Offer(&chain.SignedHead{Head: b, Sigs: []chain.Signature{sig}})
		require.NoError(t, err)
		require.True(t, ok)
		var held map[string]float64
		if r == 0 {
			held = map[string]float64{"loss": 3}
		}
		require.NoError(t, tips.SetNotes(id, r, signedNotes(t, k, id, r, held)))
		w.status.Update(func(s *status.Status) { s.Head = id.String() })
		w.record(headSeen{id: id, h: h, took: time.Second})
		ids, parent = append(ids, id), id
	}
	require.Equal(t, 4, strings.Count(out.String(), "\n"), "a progress line for each round: %s", out.String())
	out.Reset()
	heldOut := func() []map[string]float64 {
		var out []map[string]float64
		w.status.Update(func(s *status.Status) {
			for _, p := range s.History {
				out = append(out, p.HeldOut)
			}
		})
		return out
	}
	w.completeRecorded()
	require.Equal(t, []map[string]float64{{"loss": 3}, nil, nil, nil}, heldOut(), "nothing came yet")
	require.Empty(t, out.String())

	require.NoError(t, tips.SetNotes(ids[1], 1, signedNotes(t, k, ids[1], 1, map[string]float64{"loss": 2})))
	w.completeRecorded()
	require.Equal(t, []map[string]float64{{"loss": 3}, {"loss": 2}, nil, nil}, heldOut())
	require.Equal(t, "round   1/100  held-out loss 2.0000  (came after the round's line)  head "+cids.Short(ids[1].String())+"\n", out.String(),
		"the metrics of a round printed without them get a line")
	out.Reset()
	w.completeRecorded()
	require.Empty(t, out.String(), "once")

	require.NoError(t, tips.SetNotes(ids[2], 2, signedNotes(t, k, ids[2], 2, map[string]float64{"loss": 1})))
	w.completeRecorded()
	require.Equal(t, []map[string]float64{{"loss": 3}, {"loss": 2}, {"loss": 1}, nil}, heldOut())
	require.NotNil(t, w.status.Snapshot().History[2].Time, "the rest of the notes is kept")
	require.Nil(t, w.status.Snapshot().HeadMetrics, "round 3's metrics have not come")

	require.True(t, w.awaitsHeldOut(ids[3]))
	failed := &chain.Notes{Round: 3, Seconds: 2, TrainSeconds: 1, HeldOutFailed: true}
	require.NoError(t, chain.SignNotes(k, ids[3], failed))
	require.NoError(t, tips.SetNotes(ids[3], 3, failed))
	require.False(t, w.awaitsHeldOut(ids[3]), "no metrics come after a failed evaluation")
	w.completeRecorded()
	require.True(t, w.status.Snapshot().History[3].HeldOutFailed)
	require.Contains(t, out.String(), "round   3/100  held-out evaluation failed")
	require.Equal(t, []map[string]float64{{"loss": 3}, {"loss": 2}, {"loss": 1}, nil}, heldOut())
}

func signedNotes(t *testing.T, k crypto.PrivKey, id cid.Cid, round uint64, held map[string]float64) *chain.Notes {
	t.Helper()
	n := &chain.Notes{Round: round, Seconds: 2, TrainSeconds: 1, HeldOut: held, HeldOutDue: held == nil}
	require.NoError(t, chain.SignNotes(k, id, n))
	return n
}
