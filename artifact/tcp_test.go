package artifact

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// Over real loopback TCP (Noise, yamux): stream deadlines, resource scopes and the
// default 1 MiB chunks, which mocknet does not exercise.
func TestFetchOverTCP(t *testing.T) {
	fh, hh := tcpHosts(t)
	holderStore, err := OpenStore(t.TempDir(), Options{})
	require.NoError(t, err)
	data := randomBytes(40, 9<<20+123)
	id, err := holderStore.PutBytes(data)
	require.NoError(t, err)
	hx := NewExchange(hh, holderStore, ExchangeOptions{})
	t.Cleanup(func() { hx.Close() })

	dir := t.TempDir()
	store, err := OpenStore(dir, Options{})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	fx := NewExchange(fh, store, ExchangeOptions{Registerer: reg})
	t.Cleanup(func() { fx.Close() })
	fetcher := &testNode{h: fh, store: store, x: fx, reg: reg}

	require.NoError(t, fx.Fetch(fetchCtx(t, 30*time.Second), id, hh.ID()))
	requireStored(t, fetcher, id, data)
	st, err := os.Stat(filepath.Join(dir, "blobs", id.String()))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o444), st.Mode().Perm())
}

// A holder drops a stream that sat idle (real deadlines, so TCP): a fetcher whose
// stream waited long for work opens a fresh one instead of losing a good holder.
func TestIdleStreamIsReopened(t *testing.T) {
	fh, good, bad := newTCPHost(t), newTCPHost(t), newTCPHost(t)
	connectTCP(t, fh, good)
	connectTCP(t, fh, bad)
	opts := ExchangeOptions{RequestTimeout: 500 * time.Millisecond, Window: 4, StreamsPerPeer: 1, idleReopen: 50 * time.Millisecond}
	fetcher := newTestNode(t, fh, t.TempDir(), opts)
	goodNode := newTestNode(t, good, t.TempDir(), ExchangeOptions{holderIdle: 150 * time.Millisecond})
	badNode := newTestNode(t, bad, t.TempDir(), ExchangeOptions{})
	data := randomBytes(41, 64*testChunk)
	id := seed(t, data, goodNode, badNode)

	// The bad holder answers the manifest and then sits on its chunk requests, so the
	// good holder's stream idles past the holder's idle timeout until the stall is
	// detected and those chunks come back.
	mb, err := badNode.store.ManifestBytes(id)
	require.NoError(t, err)
	release := make(chan struct{})
	defer close(release)
	fakeHolder(t, badNode, func(s network.Stream, r request) bool {
		if r.kind == reqManifest {
			frame := appendUvarint(nil, uint64(1+len(mb)))
			_, err := s.Write(append(append(frame, respManifest), mb...))
			return err == nil
		}
		<-release
		return false
	})

	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id, bad.ID(), good.ID()))
	requireStored(t, fetcher, id, data)
	require.Equal(t, 1.0, fetcher.metric(t, "p2ptrain_artifact_peer_drops_total", "outcome", peerStalled))
	require.Zero(t, fetcher.metric(t, "p2ptrain_artifact_peer_drops_total", "outcome", peerGone), "the good holder was kept")
}
