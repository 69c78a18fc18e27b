package p2p

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/config"
)

// A node with node.reachability private reserves a slot at its bootstrap peer (a relay)
// by itself (AutoRelay), and a node that cannot dial it — it knows no address of it, as a
// validator behind NAT knows none of a trainer behind another — fetches its artifact
// through that relay (artifact.ExchangeOptions.Relays from node.bootstrap). The kept-peer
// dial stays direct: with the holder's relay addresses in its peerstore, it does not open
// a relayed connection.
func TestPrivateNodeServesArtifactsThroughItsBootstrapRelay(t *testing.T) {
	relayCfg := config.Default()
	relayCfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	relayCfg.Experiment.Roles = []string{config.RoleBootstrap}
	relayCfg.Node.Reachability = config.ReachPublic
	rh := cfgHost(t, relayCfg)
	bootstrap := fmt.Sprintf("%s/p2p/%s", rh.Addrs()[0], rh.ID())

	holderCfg := config.Default()
	holderCfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	holderCfg.Node.Bootstrap = []string{bootstrap}
	holderCfg.Node.Reachability = config.ReachPrivate
	hh := cfgHost(t, holderCfg)
	hs, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	require.NoError(t, err)
	data := make([]byte, 3<<20+5)
	_, _ = rand.Read(data)
	id, err := hs.PutBytes(data)
	require.NoError(t, err)
	hx := artifact.NewExchange(hh, hs, artifact.ExchangeOptions{})
	t.Cleanup(func() { hx.Close() })

	fetchCfg := config.Default()
	fetchCfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	fetchCfg.Node.Bootstrap = []string{bootstrap}
	fh := cfgHost(t, fetchCfg)
	relays, err := BootstrapPeers(fetchCfg)
	require.NoError(t, err)
	require.NoError(t, fh.Connect(context.Background(), relays[0]))
	fs, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	require.NoError(t, err)
	fx := artifact.NewExchange(fh, fs, artifact.ExchangeOptions{Relays: relays, RequestTimeout: 3 * time.Second})
	t.Cleanup(func() { fx.Close() })

	// AutoRelay reserves within moments of the host's start; until then the relay refuses.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = fx.Fetch(ctx, id, hh.ID())
		cancel()
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "no fetch through the relay in 30 s: %v", err)
		time.Sleep(200 * time.Millisecond)
	}
	got, err := fs.ReadAll(id)
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.Equal(t, network.Limited, fh.Network().Connectedness(hh.ID()), "the fetch's connection to the holder is relayed")

	// Identify on the relayed connection taught the fetcher the holder's loopback
	// addresses, which a peer behind NAT would not answer at: keep only the relay's.
	circuit := ma.StringCast(fmt.Sprintf("%s/p2p/%s/p2p-circuit", rh.Addrs()[0], rh.ID()))
	closeConns := func() {
		for _, c := range fh.Network().ConnsToPeer(hh.ID()) {
			require.NoError(t, c.Close())
		}
		fh.Peerstore().ClearAddrs(hh.ID())
		fh.Peerstore().AddAddr(hh.ID(), circuit, time.Minute)
	}
	closeConns()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.Error(t, dialKept(ctx, fh, peer.AddrInfo{ID: hh.ID()}, 2*time.Second, slog.New(slog.DiscardHandler)),
		"a kept peer known only by relay addresses is not dialled through the relay")
	require.Equal(t, network.NotConnected, fh.Network().Connectedness(hh.ID()))
	// What the kept-peer loop did before: a plain dial takes the relay.
	require.NoError(t, fh.Connect(ctx, peer.AddrInfo{ID: hh.ID()}))
	require.Equal(t, network.Limited, fh.Network().Connectedness(hh.ID()))
}

// cfgHost is NewHost for cfg with a fresh key, closed with the test.
func cfgHost(t *testing.T, cfg *config.Config) host.Host {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	h, err := NewHost(cfg, key, metrics.NewBandwidthCounter(), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	return h
}
