package p2p

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/stretchr/testify/require"
)

// dialerHost is a libp2p host on loopback whose TCP transport dials through d.
func dialerHost(t *testing.T, d *tcpDialer) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.Security(noise.ID, noise.New), libp2p.Transport(tcp.NewTCPTransport, d.option()),
		libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	require.NoError(t, err)
	d.attach(h)
	t.Cleanup(func() { h.Close() })
	return h
}

func localPort(t *testing.T, c network.Conn) int {
	t.Helper()
	na, err := manet.ToNetAddr(c.LocalMultiaddr())
	require.NoError(t, err)
	return na.(*net.TCPAddr).Port
}

// TestRedialAfterAnEndedConnectionLeavesTheListenPort: a host dials from its listen port,
// as go-libp2p does; once a connection it dialled has ended, a new dial to that address
// goes from another port for FreshPortFor (a home router holds the old tuple's conntrack
// entry in CLOSE and drops SYNs matching it: docs/wan.md, *Faults on the way*), then from
// the listen port again. A connection the other side dialled changes nothing.
func TestRedialAfterAnEndedConnectionLeavesTheListenPort(t *testing.T) {
	if !tcpDialerReuses(t) {
		t.Skip("SO_REUSEPORT is not available here (or LIBP2P_TCP_REUSEPORT=false)")
	}
	var mu sync.Mutex
	clock := time.Now()
	da, db := newTCPDialer(), newTCPDialer()
	db.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	a, b := dialerHost(t, da), dialerHost(t, db)
	bPort := listenPort(t, b)
	ctx := context.Background()

	connect := func() network.Conn {
		t.Helper()
		require.NoError(t, b.Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: a.Addrs()}))
		conns := b.Network().ConnsToPeer(a.ID())
		require.Len(t, conns, 1)
		return conns[0]
	}
	hangUp := func() {
		t.Helper()
		db.mu.Lock()
		ends := db.endsN
		db.mu.Unlock()
		require.NoError(t, b.Network().ClosePeer(a.ID()))
		// The end is seen by a notification libp2p sends from a goroutine of its own.
		require.Eventually(t, func() bool {
			db.mu.Lock()
			defer db.mu.Unlock()
			return db.endsN == ends+1
		}, 5*time.Second, 10*time.Millisecond)
	}

	steps := []struct {
		name       string
		before     func()
		listenPort bool
	}{
		{"the first dial, from the listen port", func() {}, true},
		{"a redial right after the connection ended, from another port", hangUp, false},
		{"a redial FreshPortFor later, from the listen port again", func() {
			hangUp()
			mu.Lock()
			clock = clock.Add(FreshPortFor)
			mu.Unlock()
		}, true},
	}
	for _, s := range steps {
		s.before()
		c := connect()
		if s.listenPort {
			require.Equal(t, bPort, localPort(t, c), s.name)
		} else {
			require.NotEqual(t, bPort, localPort(t, c), s.name)
		}
	}
	require.Equal(t, 1, db.freshN)

	// a dials b and hangs up: an inbound connection's end is not b's to remember.
	hangUp()
	db.mu.Lock()
	clear(db.ended)
	db.mu.Unlock()
	require.NoError(t, a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}))
	require.NoError(t, a.Network().ClosePeer(b.ID()))
	require.Eventually(t, func() bool { return len(b.Network().ConnsToPeer(a.ID())) == 0 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // the notification, if there were one
	db.mu.Lock()
	defer db.mu.Unlock()
	require.Empty(t, db.ended)
}

func tcpDialerReuses(t *testing.T) bool { return newTCPDialer().reuse }

func listenPort(t *testing.T, h host.Host) int {
	t.Helper()
	for _, a := range h.Network().ListenAddresses() {
		if isDirectTCP(a) {
			na, err := manet.ToNetAddr(a)
			require.NoError(t, err)
			return na.(*net.TCPAddr).Port
		}
	}
	t.Fatal("no TCP listen address")
	return 0
}
