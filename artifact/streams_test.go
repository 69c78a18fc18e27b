package artifact

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/stretchr/testify/require"
)

func TestStreamsFollowTheHoldersDistance(t *testing.T) {
	defaults := ExchangeOptions{}.withDefaults()
	one := ExchangeOptions{StreamsPerPeer: 1, MaxStreamsPerPeer: 1}.withDefaults()
	tests := []struct {
		name string
		opts ExchangeOptions
		rtt  time.Duration
		want int
	}{
		{"unknown", defaults, 0, 2},
		{"loopback", defaults, 100 * time.Microsecond, 2},
		{"a city away", defaults, 20 * time.Millisecond, 2},
		{"two steps", defaults, 64 * time.Millisecond, 2},
		{"just past two", defaults, 65 * time.Millisecond, 3},
		{"100 ms", defaults, 100 * time.Millisecond, 4},
		{"250 ms", defaults, 250 * time.Millisecond, 8},
		{"a satellite: the most", defaults, 700 * time.Millisecond, 8},
		{"pinned to one", one, 250 * time.Millisecond, 1},
		{"a maximum below the floor is the floor", ExchangeOptions{StreamsPerPeer: 3, MaxStreamsPerPeer: 1}.withDefaults(), time.Second, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.opts.streamsFor(tt.rtt))
		})
	}
}

// Downloads from one far holder share farStreamBudget beyond their StreamsPerPeer, so
// together they stay within what the holder accepts from one peer.
func TestFarStreamsShareABudget(t *testing.T) {
	c := newCluster(t, 3, mocknet.LinkOptions{}, ExchangeOptions{})
	x, far, near := c.nodes[0].x, c.nodes[1].id(), c.nodes[2].id()
	x.h.Peerstore().RecordLatency(far, 250*time.Millisecond)
	steps := []struct {
		op   string // reserve or release (of the n given)
		p    peer.ID
		n    int
		held int // streams held to p afterwards
	}{
		{"reserve", far, 8, 8},
		{"reserve", far, 4, 12},
		{"reserve", far, 2, 14}, // the budget is spent: StreamsPerPeer still
		{"reserve", near, 2, 2}, // another holder has a budget of its own
		{"release", far, 8, 6},
		{"reserve", far, 6, 12},
		{"release", far, 4, 8},
		{"release", far, 2, 6},
		{"release", far, 6, 0},
		{"reserve", far, 8, 8},
	}
	for i, s := range steps {
		switch s.op {
		case "reserve":
			require.Equal(t, s.n, x.reserveStreams(s.p), "step %d", i)
		case "release":
			x.releaseStreams(s.p, s.n)
		}
		x.mu.Lock()
		require.Equal(t, s.held, x.streams[s.p], "step %d: streams held", i)
		x.mu.Unlock()
	}
}

// A download times its holder on the way (the manifest's round trip) and opens more
// streams to one far away; when it ends it holds none. The bounds allow for a loaded
// machine, where every round trip, also on a link without latency, measures longer.
func TestDownloadOpensMoreStreamsToAFarHolder(t *testing.T) {
	tests := []struct {
		name       string
		latency    time.Duration // one way
		atLeast    int           // sessions
		rttAtLeast time.Duration
	}{
		{"near", 0, 2, 0},
		{"50 ms each way", 50 * time.Millisecond, 3, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, 2, mocknet.LinkOptions{Latency: tt.latency}, ExchangeOptions{})
			fetcher, holder := c.nodes[0], c.nodes[1]
			var opened atomic.Int32
			holder.h.SetStreamHandler(ProtocolID, func(s network.Stream) {
				opened.Add(1)
				holder.x.handleStream(s)
			})
			data := randomBytes(7, 64*testChunk)
			id := seed(t, data, holder)
			require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id, holder.id()))
			requireStored(t, fetcher, id, data)

			rtt := fetcher.h.Peerstore().LatencyEWMA(holder.id())
			require.GreaterOrEqual(t, rtt, tt.rttAtLeast, "the holder's round trip is recorded")
			sessions := int(opened.Load()) - 1 // one stream asked for the manifest
			require.GreaterOrEqual(t, sessions, tt.atLeast, "streams opened for chunks (rtt %v)", rtt)
			require.LessOrEqual(t, sessions, DefaultMaxStreamsPerPeer, "streams opened for chunks (rtt %v)", rtt)
			// The average after the fetch is 0.9 × the manifest's round trip, which set the
			// count, + 0.1 × the first chunk's: below 50 ms the manifest's was below 64 ms.
			if rtt < 50*time.Millisecond {
				require.Equal(t, DefaultStreamsPerPeer, sessions, "streams opened to a near holder (rtt %v)", rtt)
			}
			fetcher.x.mu.Lock()
			defer fetcher.x.mu.Unlock()
			require.Empty(t, fetcher.x.streams, "the download gave its streams back")
		})
	}
}
