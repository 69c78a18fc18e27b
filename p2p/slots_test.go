package p2p

import (
	"context"
	"crypto/rand"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

func TestConnWatermarksSitBelowTheInboundLimit(t *testing.T) {
	for _, mem := range []int64{256 << 20, 1 << 30, 3 << 30, 16 << 30} {
		limits := resourceLimits()
		concrete := limits.Scale(mem, 4096)
		inbound := int(concrete.ToPartialLimitConfig().System.ConnsInbound)
		low, high := connWatermarks(concrete)
		require.Less(t, high, inbound, "memory %d", mem)
		require.GreaterOrEqual(t, inbound-high, 8, "memory %d: free slots above the high watermark", mem)
		require.Less(t, low, high, "memory %d", mem)
	}
}

// Idle peers take every inbound connection slot of a validator; a protected validator
// peer and a trainer holding a lease, connected before, stay connected, and a new trainer
// that keeps dialling gets in within 10 s.
func TestIdlePeersCannotHoldEverySlot(t *testing.T) {
	if testing.Short() {
		t.Skip("opens ~250 loopback connections")
	}
	cfg := config.Default()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	log := slog.New(slog.DiscardHandler)
	limits := resourceLimits()
	concrete := limits.Scale(3<<30, 4096) // about 250 inbound connections, as on a 24 GiB machine
	inbound := int(concrete.ToPartialLimitConfig().System.ConnsInbound)
	require.LessOrEqual(t, inbound, 300, "the test opens one host per inbound slot")
	server, err := newHostWithLimits(cfg, key, metrics.NewBandwidthCounter(), prometheus.NewRegistry(), log, concrete)
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() })
	serverInfo := peer.AddrInfo{ID: server.ID(), Addrs: server.Addrs()}

	client := func() host.Host {
		h, err := libp2p.New(libp2p.NoListenAddrs, libp2p.Transport(tcp.NewTCPTransport), libp2p.Security(noise.ID, noise.New),
			libp2p.ResourceManager(&network.NullResourceManager{}), libp2p.DisableRelay(), libp2p.DisableMetrics())
		require.NoError(t, err)
		t.Cleanup(func() { h.Close() })
		return h
	}
	// Connected before the flood: another validator (protected as a kept peer) and a
	// trainer holding a lease (tagged when the leases went out).
	validator, leased := client(), client()
	for _, h := range []host.Host{validator, leased} {
		require.NoError(t, h.Connect(context.Background(), serverInfo))
	}
	ProtectKeptPeers(server, []peer.AddrInfo{{ID: validator.ID()}})
	newLeaseTags(server.ConnManager()).observe(&gossip.Leases{Round: 1, Leases: []lease.Lease{{Round: 1, Trainer: leased.ID().String()}}})

	// The flood: one idle identity per inbound slot, 16 handshakes at a time.
	var held, peak atomic.Int64
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for range inbound {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			h := client()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if h.Connect(ctx, serverInfo) == nil {
				held.Add(1)
			}
			n := int64(len(server.Network().Conns()))
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
		})
	}
	wg.Wait()
	t.Logf("inbound limit %d; %d idle peers connected, at most %d connections open at once", inbound, held.Load(), peak.Load())

	trainer := client()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		keepConnected(ctx, trainer, []peer.AddrInfo{serverInfo}, log)
	}()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool { return trainer.Network().Connectedness(server.ID()) == network.Connected },
		10*time.Second, 20*time.Millisecond, "new trainer joins while idle peers hold the slots")
	t.Logf("new trainer joined after %v; %d connections open", time.Since(start).Round(time.Millisecond), len(server.Network().Conns()))
	for name, h := range map[string]host.Host{"protected validator": validator, "leased trainer": leased} {
		require.Equal(t, network.Connected, server.Network().Connectedness(h.ID()), "%s was trimmed", name)
	}
}

// Trainers of the newest round's leases are tagged; a later round's leases move the tag.
func TestLeaseTagsFollowTheNewestRound(t *testing.T) {
	cm, err := connmgr.NewConnManager(10, 20)
	require.NoError(t, err)
	t.Cleanup(func() { cm.Close() })
	ids := make([]peer.ID, 3)
	for i := range ids {
		k, _, err := crypto.GenerateEd25519Key(rand.Reader)
		require.NoError(t, err)
		ids[i], err = peer.IDFromPrivateKey(k)
		require.NoError(t, err)
	}
	leases := func(round uint64, who ...peer.ID) *gossip.Leases {
		m := &gossip.Leases{Round: round}
		for _, p := range who {
			m.Leases = append(m.Leases, lease.Lease{Round: round, Trainer: p.String()})
		}
		return m
	}
	tagged := func(p peer.ID) bool {
		ti := cm.GetTagInfo(p)
		return ti != nil && ti.Tags[leaseTag] == leaseTagValue
	}
	lt := newLeaseTags(cm)
	steps := []struct {
		msg  *gossip.Leases
		want []bool
	}{
		{leases(3, ids[0]), []bool{true, false, false}},
		{leases(3, ids[1]), []bool{true, true, false}}, // a second attempt of the round
		{leases(2, ids[2]), []bool{true, true, false}}, // a late message of an older round
		{leases(4, ids[2]), []bool{false, false, true}},
	}
	for i, s := range steps {
		lt.observe(s.msg)
		for j, p := range ids {
			require.Equal(t, s.want[j], tagged(p), "step %d, trainer %d", i, j)
		}
	}
}
