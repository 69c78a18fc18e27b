package artifact

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/stretchr/testify/require"
)

// A holder the fetcher cannot dial (it knows no address of it, as a validator behind NAT
// knows none of a trainer behind another NAT) keeps a reservation at a relay both reach:
// with the relay among ExchangeOptions.Relays the fetch goes through it, on a relayed
// (limited) connection; without, it fails; and a holder the fetcher can dial is fetched
// from directly, relay or not. Real loopback TCP hosts and libp2p's circuit relay v2.
func TestFetchThroughRelayOnlyWithoutDirectPath(t *testing.T) {
	tests := []struct {
		name        string
		relays      bool // the fetcher's ExchangeOptions.Relays names the relay
		knowsHolder bool // the fetcher's peerstore has the holder's direct addresses
		wantErr     bool
		wantLimited bool
	}{
		{name: "no direct path, through the relay", relays: true, wantLimited: true},
		{name: "no direct path, no relay", wantErr: true},
		{name: "direct path and a relay: direct", relays: true, knowsHolder: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			relayInfo, holder, data, id := newRelayedHolder(t, 41, 300<<10+17)

			opts := ExchangeOptions{RequestTimeout: 5 * time.Second}
			if tc.relays {
				opts.Relays = []peer.AddrInfo{relayInfo}
			}
			fetcher := newRelayFetcher(t, relayInfo, opts)
			if tc.knowsHolder {
				fetcher.h.Peerstore().AddAddrs(holder.id(), holder.h.Addrs(), peerstore.TempAddrTTL)
			}

			err := fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id, holder.id())
			if tc.wantErr {
				require.Error(t, err)
				require.False(t, fetcher.store.Has(id))
				return
			}
			require.NoError(t, err)
			requireStored(t, fetcher, id, data)
			conns := fetcher.h.Network().ConnsToPeer(holder.id())
			require.NotEmpty(t, conns)
			for _, c := range conns {
				require.Equal(t, tc.wantLimited, c.Stat().Limited, "connection to the holder at %s", c.RemoteMultiaddr())
			}
		})
	}
}

// A relayed dial that failed leaves its circuit address in the swarm's dial backoff (here:
// the holder had no reservation yet; in the lab, go-libp2p's circuit client failing a
// second dial folded into a first). Once the holder can be reached through the relay, the
// next fetch dials again instead of failing on "dial backoff" until the backoff expires.
func TestRelayedFetchNotHeldByDialBackoff(t *testing.T) {
	relayInfo := newRelay(t)
	holder := newTestNode(t, newTCPHost(t), t.TempDir(), ExchangeOptions{})
	require.NoError(t, holder.h.Connect(context.Background(), relayInfo))
	data := randomBytes(42, 100<<10)
	id := seed(t, data, holder)
	fetcher := newRelayFetcher(t, relayInfo, ExchangeOptions{RequestTimeout: 5 * time.Second, Relays: []peer.AddrInfo{relayInfo}})
	// No reservation yet: the relay refuses, and the swarm backs the address off.
	require.Error(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id, holder.id()))
	reserve(t, holder.h, relayInfo)
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id, holder.id()))
	requireStored(t, fetcher, id, data)
}

// newRelay starts a circuit relay v2 server on loopback TCP, public at once (the relay
// service starts only on a public host), closed with the test.
func newRelay(t *testing.T) peer.AddrInfo {
	t.Helper()
	r, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Security(noise.ID, noise.New),
		libp2p.ForceReachabilityPublic(), libp2p.EnableRelayService(relay.WithLimit(&relay.RelayLimit{Duration: time.Minute, Data: 8 << 20})))
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return peer.AddrInfo{ID: r.ID(), Addrs: r.Addrs()}
}

// newRelayedHolder starts a relay and a holder of n random bytes (drawn from seedN) that
// keeps a reservation there.
func newRelayedHolder(t *testing.T, seedN uint64, n int) (peer.AddrInfo, *testNode, []byte, cid.Cid) {
	t.Helper()
	relayInfo := newRelay(t)
	holder := newTestNode(t, newTCPHost(t), t.TempDir(), ExchangeOptions{})
	reserve(t, holder.h, relayInfo)
	data := randomBytes(seedN, n)
	return relayInfo, holder, data, seed(t, data, holder)
}

// reserve connects h to the relay and reserves a slot there, retrying until the relay
// service is up (it starts once the relay's reachability event is out).
func reserve(t *testing.T, h host.Host, relayInfo peer.AddrInfo) {
	t.Helper()
	require.NoError(t, h.Connect(context.Background(), relayInfo))
	eventually(t, 10*time.Second, func() bool {
		_, err := client.Reserve(context.Background(), h, relayInfo)
		return err == nil
	}, "the holder reserves a slot at the relay")
}

// newRelayFetcher is a testNode on a fresh loopback host connected to the relay only. It
// dials relayed addresses a while after direct ones, as the node does (p2p.TCPFirst, which
// this package cannot import): libp2p's default ranker dials a holder's loopback and
// circuit addresses at once, and either connection could come first (the direct case
// below failed one time in twenty so).
func newRelayFetcher(t *testing.T, relayInfo peer.AddrInfo, opts ExchangeOptions) *testNode {
	t.Helper()
	fh, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Security(noise.ID, noise.New),
		libp2p.SwarmOpts(swarm.WithDialRanker(directFirst)))
	require.NoError(t, err)
	t.Cleanup(func() { fh.Close() })
	require.NoError(t, fh.Connect(context.Background(), relayInfo))
	return newTestNode(t, fh, t.TempDir(), opts)
}

// directFirst ranks circuit addresses 2 s after the others.
func directFirst(addrs []ma.Multiaddr) []network.AddrDelay {
	out := make([]network.AddrDelay, 0, len(addrs))
	for _, a := range addrs {
		var delay time.Duration
		if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err == nil {
			delay = 2 * time.Second
		}
		out = append(out, network.AddrDelay{Addr: a, Delay: delay})
	}
	return out
}

// A copy holder (Exchange.AddCopy: a peer that announced it keeps the artifact) is asked
// only over a direct connection. Reachable only through the relay, it gets a relayed
// connection — on which hole punching would start — and no stream: the fetch fails when
// it is the only holder, the relayed connection is closed (it holds a slot at the relay),
// and the peer is passed over as a copy holder for a while. When a
// direct connection comes of the relayed one (here the holder dials back, as DCUtR's
// simultaneous dial or a connection reversal would), the stream waits for it and the
// chunks come over it. An origin (AddHolder: the author of an update or a head) is asked
// through the relay where that is the only path.
func TestCopyHolderAskedOnlyOverADirectConnection(t *testing.T) {
	tests := []struct {
		name      string
		copy      bool
		dialsBack bool // the holder dials the fetcher directly on an inbound relayed connection
		wantErr   bool
		wantConns string // the connections to the holder at the end: none, relayed, direct
	}{
		{name: "copy, only a relay: not asked", copy: true, wantErr: true, wantConns: "none"},
		{name: "copy, a direct connection made from the relayed one: asked over it", copy: true, dialsBack: true, wantConns: "direct"},
		{name: "origin, only a relay: asked through it", wantConns: "relayed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			relayInfo, holder, data, id := newRelayedHolder(t, 43, 200<<10+5)
			fetcher := newRelayFetcher(t, relayInfo, ExchangeOptions{RequestTimeout: 3 * time.Second, Relays: []peer.AddrInfo{relayInfo}})
			if tc.dialsBack {
				back := peer.AddrInfo{ID: fetcher.id(), Addrs: fetcher.h.Addrs()}
				holder.h.Network().Notify(&network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) {
					if c.RemotePeer() == back.ID && c.Stat().Limited && c.Stat().Direction == network.DirInbound {
						go holder.h.Connect(network.WithForceDirectDial(context.Background(), "test: hole punch"), back) //nolint:errcheck // the fetch shows whether it worked
					}
				}})
			}
			if tc.copy {
				fetcher.x.AddCopy(id, holder.id())
			} else {
				fetcher.x.AddHolder(id, holder.id())
			}

			err := fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id)
			conns := "none"
			for _, c := range fetcher.h.Network().ConnsToPeer(holder.id()) {
				if !c.Stat().Limited {
					conns = "direct"
				} else if conns == "none" {
					conns = "relayed"
				}
			}
			require.Equal(t, tc.wantConns, conns, "connections to the holder")
			if tc.wantErr {
				require.Error(t, err)
				require.False(t, fetcher.store.Has(id))
				require.True(t, fetcher.x.book.isPassedOver(holder.id(), time.Now()), "the copy holder is passed over")
				return
			}
			require.NoError(t, err)
			requireStored(t, fetcher, id, data)
		})
	}
}

// A copy holder that left a download is passed over for a while when it could not be
// reached or failed the transfer, but not when the download no longer wanted it, it lacks
// the artifact, or its dial lost a race with another dial to it (a late joiner dials every
// peer at once as it starts): the download asks it again after retryLeft.
func TestCopyFailedPassesOverUnreachableHolders(t *testing.T) {
	raced := errors.New(`failed to dial: all dials failed
  * [/ip4/198.18.0.1/tcp/4001/p2p/12D3KooWNNVJUUodDYMDBVXp9r7JxXnpSCjuQ69DZK6K8dPM3am4/p2p-circuit] concurrent active dial succeeded`)
	tests := []struct {
		name       string
		err        error
		passedOver bool
	}{
		{"stream reset", errors.New("stream reset"), true},
		{"reachable through a relay only", fmt.Errorf("open stream: %w", context.DeadlineExceeded), true},
		{"download over", context.Canceled, false},
		{"pruned", errPeerLacks, false},
		{"lost a dial race", fmt.Errorf("open stream: %w", raced), false},
		{"dial backoff after a race", fmt.Errorf("open stream: %w", swarm.ErrDialBackoff), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
			x, p := c.nodes[0].x, c.nodes[1].id()
			x.copyFailed(p, tc.err)
			require.Equal(t, tc.passedOver, x.book.isPassedOver(p, time.Now()))
		})
	}
}
