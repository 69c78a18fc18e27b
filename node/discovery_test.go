package node

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
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
	go func() {
		defer close(done)
		keepConnected(ctx, node, []peer.AddrInfo{{ID: boot.ID(), Addrs: boot.Addrs()}}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
	connected := func() bool { return node.Network().Connectedness(boot.ID()) == network.Connected }

	require.Eventually(t, connected, 10*time.Second, 20*time.Millisecond, "first connection")
	for outage := range 2 {
		require.NoError(t, mn.UnlinkPeers(node.ID(), boot.ID()))
		require.NoError(t, mn.DisconnectPeers(node.ID(), boot.ID()))
		time.Sleep(4 * time.Second) // dials at +0s, +1s, +3s fail
		require.False(t, connected())
		_, err := mn.LinkPeers(node.ID(), boot.ID())
		require.NoError(t, err)
		require.Eventually(t, connected, 20*time.Second, 50*time.Millisecond, "reconnect after outage %d", outage+1)
	}
}
