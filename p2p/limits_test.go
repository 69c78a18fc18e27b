package p2p

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
)

// The node's resource manager caps how many streams of each /p2ptrain/* protocol one
// peer holds open on it, however long each stream is allowed to live; another peer is
// still served.
func TestStreamsPerPeerAreCapped(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	server := testHost(t, metrics.NewBandwidthCounter())
	store, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	require.NoError(t, err)
	x := artifact.NewExchange(server, store, artifact.ExchangeOptions{FrameDeadline: time.Minute})
	t.Cleanup(func() { x.Close() })
	heads, err := chain.OpenStore(t.TempDir())
	require.NoError(t, err)
	svc := chain.NewSyncService(server, heads, func() cid.Cid { return cid.Undef }, log, time.Minute)
	t.Cleanup(svc.Close)

	client := func() host.Host {
		h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Security(noise.ID, noise.New))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		require.NoError(t, h.Connect(context.Background(), peer.AddrInfo{ID: server.ID(), Addrs: server.Addrs()}))
		return h
	}
	attacker, other := client(), client()

	tests := []struct {
		proto protocol.ID
		limit int
	}{
		{artifact.ProtocolID, artifactStreamsPerPeer},
		{chain.SyncProtocol, syncStreamsPerPeer},
	}
	for _, tt := range tests {
		t.Run(string(tt.proto), func(t *testing.T) {
			held := holdStreams(t, attacker, server.ID(), tt.proto, tt.limit+8)
			require.Equal(t, tt.limit, held, "streams of %s one peer holds open", tt.proto)
			require.Equal(t, 1, holdStreams(t, other, server.ID(), tt.proto, 1), "another peer's stream while the first holds its limit")
		})
	}
}

// holdStreams opens n streams of proto to p at once, each starting a request frame it
// never finishes, and returns how many the remote still holds open a moment later.
func holdStreams(t *testing.T, h host.Host, p peer.ID, proto protocol.ID, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	held := 0
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			s, err := h.NewStream(ctx, p, proto)
			if err != nil {
				return // refused while negotiating
			}
			t.Cleanup(func() { s.Reset() })
			if _, err := s.Write([]byte{0x80}); err != nil {
				return
			}
			s.SetReadDeadline(time.Now().Add(time.Second))
			_, err = s.Read(make([]byte, 1))
			// Our own read deadline passing means the stream is still open; a refused
			// stream is reset by the remote at once.
			if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
				mu.Lock()
				held++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return held
}

// testHost is a node's libp2p host on loopback with a fresh key, reporting to bw, closed
// with the test.
func testHost(t *testing.T, bw metrics.Reporter) host.Host {
	t.Helper()
	cfg := config.Default()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	h, err := NewHost(cfg, key, bw, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	return h
}
