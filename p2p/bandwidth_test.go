package p2p

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	"github.com/stretchr/testify/require"
)

// The bytes a round moved are counted as they go over the node's streams: a read right
// after a transfer has all of it (libp2p's own totals would show 0 until their next
// once-a-second sweep), and the per-protocol counter still gets the bytes.
func TestByteMeterCountsEachTransferAtOnce(t *testing.T) {
	bw := metrics.NewBandwidthCounter()
	bc := NewByteCounter(bw)
	server := testHost(t, bc)
	const proto = "/p2ptrain/test-bytes/1"
	server.SetStreamHandler(proto, func(s network.Stream) {
		defer s.Close()
		b, err := io.ReadAll(s)
		if err == nil {
			_, _ = s.Write(b[:len(b)/2])
		}
	})
	client, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.Security(noise.ID, noise.New))
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, client.Connect(ctx, peer.AddrInfo{ID: server.ID(), Addrs: server.Addrs()}))

	m := NewByteMeter(bc)
	m.Delta()
	for _, size := range []int{10_000, 300_000} {
		s, err := client.NewStream(ctx, server.ID(), proto)
		require.NoError(t, err)
		_, err = s.Write(make([]byte, size))
		require.NoError(t, err)
		require.NoError(t, s.CloseWrite())
		back, err := io.ReadAll(s)
		require.NoError(t, err)
		require.Len(t, back, size/2)
		s.Close()
		// The server's handler has written its reply before the client read it to the end.
		in, out := m.Delta()
		require.GreaterOrEqual(t, in, uint64(size), "received, read at once")
		require.GreaterOrEqual(t, out, uint64(size/2), "sent, read at once")
		require.Less(t, in, uint64(size+size/10), "only this transfer (and its protocol negotiation)")
	}
	require.Eventually(t, func() bool {
		return bw.GetBandwidthForProtocol(proto).TotalIn >= 310_000
	}, 5*time.Second, 50*time.Millisecond, "the per-protocol counter gets the bytes too")
}
