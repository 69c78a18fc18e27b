package chain

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/stretchr/testify/require"
)

// A peer that starts a head-sync request and stalls loses the stream within the deadline
// (plus a second), and honest requests are answered meanwhile.
func TestSyncDropsStalledRequests(t *testing.T) {
	const deadline = time.Second
	// Real TCP hosts (mocknet streams ignore deadlines), without resource limits so that
	// the deadline alone ends the stalled streams.
	var hosts []host.Host
	for range 3 {
		h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Security(noise.ID, noise.New),
			libp2p.ResourceManager(&network.NullResourceManager{}))
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		hosts = append(hosts, h)
	}
	server, attacker, honest := hosts[0], hosts[1], hosts[2]
	for _, c := range []host.Host{attacker, honest} {
		require.NoError(t, c.Connect(context.Background(), peer.AddrInfo{ID: server.ID(), Addrs: server.Addrs()}))
	}

	st, err := OpenStore(t.TempDir())
	require.NoError(t, err)
	k, _ := key(t)
	id := putSigned(t, st, k, testHead(0, nil))
	svc := NewSyncService(server, st, func() cid.Cid { return id }, slog.New(slog.DiscardHandler), deadline)
	t.Cleanup(svc.Close)

	stalls := map[string][]byte{
		"nothing":              nil,
		"half a length prefix": {0x80},
		"length only":          {100},
		"half a frame":         {100, 1, 2, 3, 4, 5},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	held := make(map[string]time.Duration)
	var mu sync.Mutex
	for name, send := range stalls {
		for range 4 {
			wg.Go(func() {
				start := time.Now()
				s, err := attacker.NewStream(ctx, server.ID(), SyncProtocol)
				if err != nil {
					t.Errorf("%s: open stream: %v", name, err)
					return
				}
				defer s.Reset()
				if _, err := s.Write(send); err != nil {
					t.Errorf("%s: write: %v", name, err)
					return
				}
				s.SetReadDeadline(start.Add(deadline + 5*time.Second))
				_, _ = io.Copy(io.Discard, s)
				mu.Lock()
				held[name] = max(held[name], time.Since(start))
				mu.Unlock()
			})
		}
	}
	for range 5 {
		f, err := RequestTip(ctx, honest, server.ID())
		require.NoError(t, err)
		require.Equal(t, id, f.Signed.ID())
	}
	wg.Wait()
	for name, d := range held {
		require.LessOrEqual(t, d, deadline+time.Second, "%s: stream held %v, deadline %v", name, d, deadline)
	}
	t.Logf("stalled head-sync streams held at most %v (deadline %v)", held, deadline)
}

// A head being written when the process died leaves a temporary file; the store removes
// it when it opens and keeps the heads.
func TestOpenStoreRemovesTempFiles(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(dir)
	require.NoError(t, err)
	k, _ := key(t)
	h := testHead(0, nil)
	id := putSigned(t, st, k, h)
	leak := filepath.Join(dir, "."+id.String()+".tmp1234")
	require.NoError(t, os.WriteFile(leak, []byte("half a head"), 0o644))

	st, err = OpenStore(dir)
	require.NoError(t, err)
	require.NoFileExists(t, leak)
	_, got, err := st.Get(id)
	require.NoError(t, err)
	require.Equal(t, h.Round, got.Round)
}
