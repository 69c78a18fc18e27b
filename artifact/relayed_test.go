package artifact

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/client"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/prometheus/client_golang/prometheus"
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
			r, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Security(noise.ID, noise.New),
				libp2p.ForceReachabilityPublic(), libp2p.EnableRelayService(relay.WithLimit(&relay.RelayLimit{Duration: time.Minute, Data: 8 << 20})))
			require.NoError(t, err)
			t.Cleanup(func() { r.Close() })
			relayInfo := peer.AddrInfo{ID: r.ID(), Addrs: r.Addrs()}

			hh := newTCPHost(t)
			connectTCP(t, hh, r)
			// The relay service starts once the host's reachability event is out.
			var resErr error
			eventually(t, 10*time.Second, func() bool {
				_, resErr = client.Reserve(context.Background(), hh, relayInfo)
				return resErr == nil
			}, "the holder reserves a slot at the relay")
			holderStore, err := OpenStore(t.TempDir(), Options{ChunkSize: testChunk})
			require.NoError(t, err)
			data := randomBytes(41, 300<<10+17)
			id, err := holderStore.PutBytes(data)
			require.NoError(t, err)
			hx := NewExchange(hh, holderStore, ExchangeOptions{})
			t.Cleanup(func() { hx.Close() })

			fh := newTCPHost(t)
			connectTCP(t, fh, r)
			if tc.knowsHolder {
				fh.Peerstore().AddAddrs(hh.ID(), hh.Addrs(), peerstore.TempAddrTTL)
			}
			opts := ExchangeOptions{RequestTimeout: 5 * time.Second}
			if tc.relays {
				opts.Relays = []peer.AddrInfo{relayInfo}
			}
			fetcher := newFetcher(t, fh, opts)

			err = fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id, hh.ID())
			if tc.wantErr {
				require.Error(t, err)
				require.False(t, fetcher.store.Has(id))
				return
			}
			require.NoError(t, err)
			requireStored(t, fetcher, id, data)
			conns := fh.Network().ConnsToPeer(hh.ID())
			require.NotEmpty(t, conns)
			for _, c := range conns {
				require.Equal(t, tc.wantLimited, c.Stat().Limited, "connection to the holder at %s", c.RemoteMultiaddr())
			}
		})
	}
}

// newFetcher is a testNode on h with an empty store.
func newFetcher(t *testing.T, h host.Host, opts ExchangeOptions) *testNode {
	t.Helper()
	store, err := OpenStore(t.TempDir(), Options{ChunkSize: testChunk})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	x := NewExchange(h, store, opts)
	t.Cleanup(func() { x.Close() })
	return &testNode{h: h, store: store, x: x, reg: reg}
}

// A relayed dial that failed leaves its circuit address in the swarm's dial backoff (here:
// the holder had no reservation yet; in the lab, go-libp2p's circuit client failing a
// second dial folded into a first). Once the holder can be reached through the relay, the
// next fetch dials again instead of failing on "dial backoff" until the backoff expires.
func TestRelayedFetchNotHeldByDialBackoff(t *testing.T) {
	r, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Security(noise.ID, noise.New),
		libp2p.ForceReachabilityPublic(), libp2p.EnableRelayService(relay.WithLimit(&relay.RelayLimit{Duration: time.Minute, Data: 8 << 20})))
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	relayInfo := peer.AddrInfo{ID: r.ID(), Addrs: r.Addrs()}
	hh := newTCPHost(t)
	connectTCP(t, hh, r)
	holderStore, err := OpenStore(t.TempDir(), Options{ChunkSize: testChunk})
	require.NoError(t, err)
	data := randomBytes(42, 100<<10)
	id, err := holderStore.PutBytes(data)
	require.NoError(t, err)
	hx := NewExchange(hh, holderStore, ExchangeOptions{})
	t.Cleanup(func() { hx.Close() })

	fh := newTCPHost(t)
	connectTCP(t, fh, r)
	fetcher := newFetcher(t, fh, ExchangeOptions{RequestTimeout: 5 * time.Second, Relays: []peer.AddrInfo{relayInfo}})
	// No reservation yet: the relay refuses, and the swarm backs the address off.
	require.Error(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id, hh.ID()))
	eventually(t, 10*time.Second, func() bool {
		_, err := client.Reserve(context.Background(), hh, relayInfo)
		return err == nil
	}, "the holder reserves a slot at the relay")
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id, hh.ID()))
	requireStored(t, fetcher, id, data)
}
