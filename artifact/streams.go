package artifact

import (
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Streams to a holder far away (issue 46 item 3, docs/wan.md). A yamux stream starts
// with a 256 KiB receive window and doubles it only when a window's worth comes back
// within a few round trips, which losses prevent: at 250 ms and 0.5 % loss a download
// over the default two streams moved 0.84 of what one raw TCP flow did, over eight 0.98.
// Larger windows for every stream would be memory a hostile peer can fill (yamux
// accounts 256 KiB per stream whatever it grants), so instead a download opens one
// stream per streamRTTStep of the holder's round-trip time, between StreamsPerPeer and
// MaxStreamsPerPeer. The window of chunk requests in flight per holder is split between
// them as before, so more streams hold no more memory.
const (
	// DefaultMaxStreamsPerPeer is the most streams one download opens to a far holder.
	DefaultMaxStreamsPerPeer = 8
	// streamRTTStep is the round-trip time each stream is opened for: 100 ms gets 4,
	// 250 ms gets 8.
	streamRTTStep = 32 * time.Millisecond
	// farStreamBudget bounds the streams this node's downloads hold to one holder
	// together where they open more than StreamsPerPeer: holders accept 16 artifact
	// streams from one peer (p2p's resource-manager limits), and manifest requests and
	// our other downloads need room. A download always gets StreamsPerPeer.
	farStreamBudget = 12
)

// streamsFor is how many streams a download wants to a holder rtt away (0: unknown).
func (o ExchangeOptions) streamsFor(rtt time.Duration) int {
	n := o.StreamsPerPeer
	if rtt > 0 {
		n = max(n, min(o.MaxStreamsPerPeer, int((rtt+streamRTTStep-1)/streamRTTStep)))
	}
	return n
}

// reserveStreams is how many streams a new download may open to p: what p's round-trip
// time asks for, as far as farStreamBudget allows beside the streams other downloads
// hold to p, and never fewer than StreamsPerPeer. releaseStreams gives them back.
func (x *Exchange) reserveStreams(p peer.ID) int {
	want := x.opts.streamsFor(x.h.Peerstore().LatencyEWMA(p))
	x.mu.Lock()
	defer x.mu.Unlock()
	n := max(x.opts.StreamsPerPeer, min(want, farStreamBudget-x.streams[p]))
	x.streams[p] += n
	return n
}

func (x *Exchange) releaseStreams(p peer.ID, n int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.streams[p] -= n; x.streams[p] <= 0 {
		delete(x.streams, p)
	}
}

// recordRTT notes a round trip to p (a request until its answer's first frame) in the
// peerstore, whose moving average reserveStreams reads.
func (x *Exchange) recordRTT(p peer.ID, since time.Time) {
	x.h.Peerstore().RecordLatency(p, time.Since(since))
}
