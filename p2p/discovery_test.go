package p2p

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/stretchr/testify/require"
)

// TestKeepConnectedRedialsAfterAnOutage: the bootstrap peer goes away long enough for
// several dials to fail, then comes back; the node connects again. (A node that backed
// off from a peer on every tick, dialled or not, never dialled it again: a trainer lost
// its validator for good after the validator restarted.)
func TestKeepConnectedRedialsAfterAnOutage(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	boot, err := mn.GenPeer()
	require.NoError(t, err)
	node, err := mn.GenPeer()
	require.NoError(t, err)
	require.NoError(t, mn.LinkAll())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	failed := &dialFailures{}
	go func() {
		defer close(done)
		keepConnected(ctx, node, []peer.AddrInfo{{ID: boot.ID(), Addrs: boot.Addrs()}}, slog.New(failed))
	}()
	t.Cleanup(func() { cancel(); <-done })
	connected := func() bool { return node.Network().Connectedness(boot.ID()) == network.Connected }

	require.Eventually(t, connected, 10*time.Second, 20*time.Millisecond, "first connection")
	for outage := range 2 {
		require.NoError(t, mn.UnlinkPeers(node.ID(), boot.ID()))
		require.NoError(t, mn.DisconnectPeers(node.ID(), boot.ID()))
		failed.await(t, 3)
		require.False(t, connected())
		_, err := mn.LinkPeers(node.ID(), boot.ID())
		require.NoError(t, err)
		require.Eventually(t, connected, 20*time.Second, 50*time.Millisecond, "reconnect after outage %d", outage+1)
	}
}

// A restarted validator or bootstrap peer (same key, same address, back after an outage
// long enough for many dials to fail) is redialled within 2 s of listening again, whether
// it is a bootstrap peer (configured address) or a validator (address learnt earlier,
// even when the peerstore lost it: keptWatch remembers it).
func TestRestartedPeerIsRedialledWithin2s(t *testing.T) {
	for _, tt := range []struct {
		name      string
		withAddrs bool
		// lost: the peerstore drops the validator's addresses once it is gone, as it does
		// when an identify exchange completes just after the disconnection.
		lost bool
	}{{"bootstrap peer", true, false}, {"validator", false, false}, {"validator whose addresses the peerstore lost", false, true}} {
		t.Run(tt.name, func(t *testing.T) {
			key, _, err := crypto.GenerateEd25519Key(rand.Reader)
			require.NoError(t, err)
			listen := func(addr string) host.Host {
				h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings(addr), libp2p.Security(noise.ID, noise.New))
				require.NoError(t, err)
				return h
			}
			server := listen("/ip4/127.0.0.1/tcp/0")
			addr := server.Addrs()[0]
			node, err := libp2p.New(libp2p.NoListenAddrs, libp2p.Security(noise.ID, noise.New))
			require.NoError(t, err)
			t.Cleanup(func() { node.Close() })
			kept := peer.AddrInfo{ID: server.ID()}
			if tt.withAddrs {
				kept.Addrs = server.Addrs()
			}
			// As bootstrapModule does: watch before anything dials.
			w := WatchKept(node, []peer.AddrInfo{kept})
			t.Cleanup(w.Close)
			if !tt.withAddrs {
				// A validator's address is what the node learnt while connected to it.
				require.NoError(t, node.Connect(context.Background(), peer.AddrInfo{ID: server.ID(), Addrs: server.Addrs()}))
			}

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			failed := &dialFailures{}
			go func() {
				defer close(done)
				w.Keep(ctx, slog.New(failed))
			}()
			t.Cleanup(func() { cancel(); <-done })
			connected := func() bool { return node.Network().Connectedness(server.ID()) == network.Connected }
			require.Eventually(t, connected, 10*time.Second, 10*time.Millisecond, "first connection")

			require.NoError(t, server.Close())
			if tt.lost {
				require.Eventually(t, func() bool { return !connected() }, 10*time.Second, 10*time.Millisecond)
				node.Peerstore().ClearAddrs(server.ID())
			}
			failed.await(t, 5) // backoffs grow to their longest
			require.False(t, connected())
			server = listen(addr.String())
			t.Cleanup(func() { server.Close() })
			back := time.Now()
			require.Eventually(t, connected, 10*time.Second, 10*time.Millisecond, "reconnect")
			took := time.Since(back)
			t.Logf("redialled %v after the restarted peer listened", took.Round(time.Millisecond))
			require.Less(t, took, 2*time.Second)
		})
	}
}

// A bootstrap address where nothing answers is warned about within 10 s, naming the
// address; a reachable one is not.
func TestUnreachableBootstrapWarnsWithin10s(t *testing.T) {
	// Refused: a port that was just closed. Silent: TCP accepted, then nothing said (the
	// security handshake hangs until the dial times out).
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refusedAddr := closed.Addr().(*net.TCPAddr)
	require.NoError(t, closed.Close())
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { silent.Close() })
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	silentAddr := silent.Addr().(*net.TCPAddr)
	server, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Security(noise.ID, noise.New))
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() })

	otherID := func() peer.ID {
		_, pub, err := crypto.GenerateEd25519Key(rand.Reader)
		require.NoError(t, err)
		id, err := peer.IDFromPublicKey(pub)
		require.NoError(t, err)
		return id
	}
	for _, tc := range []struct {
		name string
		ai   peer.AddrInfo
		warn bool
	}{
		{"nothing listens", peer.AddrInfo{ID: otherID(), Addrs: []ma.Multiaddr{ma.StringCast(fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", refusedAddr.Port))}}, true},
		{"listens, never answers", peer.AddrInfo{ID: otherID(), Addrs: []ma.Multiaddr{ma.StringCast(fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", silentAddr.Port))}}, true},
		{"a live peer", peer.AddrInfo{ID: server.ID(), Addrs: server.Addrs()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			node, err := libp2p.New(libp2p.NoListenAddrs, libp2p.Security(noise.ID, noise.New))
			require.NoError(t, err)
			t.Cleanup(func() { node.Close() })
			logs := &lockedLog{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			start := time.Now()
			go func() {
				defer close(done)
				keepConnected(ctx, node, []peer.AddrInfo{tc.ai}, slog.New(slog.NewTextHandler(logs, nil)))
			}()
			t.Cleanup(func() { cancel(); <-done })
			warned := func() bool { return strings.Contains(logs.String(), "cannot reach a bootstrap peer") }
			if !tc.warn {
				require.Eventually(t, func() bool { return node.Network().Connectedness(tc.ai.ID) == network.Connected },
					10*time.Second, 10*time.Millisecond)
				time.Sleep(keepWarnAfter + time.Second) // past the point a warning would come
				require.False(t, warned(), "warned of a reachable peer:\n%s", logs.String())
				return
			}
			require.Eventually(t, warned, 10*time.Second, 10*time.Millisecond, "no warning within 10 s:\n%s", logs.String())
			t.Logf("warned after %v: %s", time.Since(start).Round(time.Millisecond), logs.String())
			require.Contains(t, logs.String(), tc.ai.Addrs[0].String())
			require.Contains(t, logs.String(), tc.ai.ID.String())
			require.Equal(t, 1, strings.Count(logs.String(), "cannot reach a bootstrap peer"), "warned once per outage")
		})
	}
}

// lockedLog is a log sink the test reads while the node writes it.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// dialFailures is a log handler that counts the kept-peer dials that failed.
type dialFailures struct {
	n atomic.Int64
}

func (d *dialFailures) Enabled(context.Context, slog.Level) bool { return true }
func (d *dialFailures) WithAttrs([]slog.Attr) slog.Handler       { return d }
func (d *dialFailures) WithGroup(string) slog.Handler            { return d }

func (d *dialFailures) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "dial of a bootstrap peer or validator failed" {
		d.n.Add(1)
	}
	return nil
}

// await waits until n more dials than now have failed.
func (d *dialFailures) await(t *testing.T, n int64) {
	t.Helper()
	want := d.n.Load() + n
	require.Eventually(t, func() bool { return d.n.Load() >= want }, 30*time.Second, 10*time.Millisecond,
		"%d failed dials of the kept peer", n)
}

// A link to a kept peer that goes dark (everything dropped, both sockets open, as when a
// cable is pulled or a home router loses its uplink) is noticed by pinging the connection
// over itself: the node closes it and dials again, and once the link is back it is
// connected on a connection that answers. Without the probe the dark connection stays
// "connected" until yamux's keepalive gives up (30 s and a 10-s timeout, past the 20 s
// this test waits), and the node does not dial. A kept peer that does not speak the ping
// protocol keeps its connection: only silence counts.
func TestKeptPeerDarkLinkIsClosedAndRedialled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	server, node := tcpHost(t, true), tcpHost(t, false)
	na, err := manet.ToNetAddr(server.Addrs()[0])
	require.NoError(t, err)
	bh := newBlackhole(t, na.String())
	viaLink, err := manet.FromNetAddr(bh.ln.Addr())
	require.NoError(t, err)

	w := WatchKept(node, []peer.AddrInfo{{ID: server.ID(), Addrs: []ma.Multiaddr{viaLink}}})
	t.Cleanup(w.Close)
	w.dialTimeout, w.probeEvery, w.probeTimeout = time.Second, 200*time.Millisecond, time.Second
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Keep(ctx, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
	live := func() network.Conn {
		for _, c := range node.Network().ConnsToPeer(server.ID()) {
			if !c.IsClosed() {
				return c
			}
		}
		return nil
	}
	eventually(t, "the first connection", func() bool { return live() != nil })
	first := live()

	bh.drop.Store(true)
	eventually(t, "the dark connection closed", first.IsClosed)
	time.Sleep(2 * time.Second) // dials through the dark link fail meanwhile
	bh.drop.Store(false)
	var again network.Conn
	eventually(t, "connected again", func() bool { again = live(); return again != nil })
	require.NoError(t, pingOver(ctx, again), "the new connection answers")

	// A peer without the ping protocol refuses the probe: an answer, not silence.
	server.RemoveStreamHandler(ping.ID)
	time.Sleep(1500 * time.Millisecond) // several probes
	require.False(t, again.IsClosed(), "a refused ping closed a live connection")
}
