package artifact

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/p2pnode/p2pnode/internal/promreg"
)

// Outcomes of a Fetch (label "outcome" of p2ptrain_artifact_fetches_total).
const (
	fetchOK       = "ok"        // downloaded and installed
	fetchPresent  = "present"   // the store already held it
	fetchNotFound = "not_found" // no peer holds it
	fetchCanceled = "canceled"  // the caller gave up (partial state kept for resume)
	fetchFailed   = "failed"    // anything else
)

// Outcomes for a peer dropped from a fetch (label "outcome" of
// p2ptrain_artifact_peer_drops_total). The first three also penalise the peer.
const (
	peerBadChunk    = "bad_chunk"    // sent a chunk that does not hash to its CID
	peerBadManifest = "bad_manifest" // sent manifest bytes that do not hash to the id
	peerProtocol    = "protocol"     // unsolicited or malformed frames
	peerStalled     = "stalled"      // no data within RequestTimeout
	peerGone        = "gone"         // stream or connection failed
	peerNotFound    = "not_found"    // does not hold the artifact
	peerRefused     = "refused"      // answered with an error frame
)

type metrics struct {
	bytesSent     prometheus.Counter
	bytesReceived prometheus.Counter
	bytesResumed  prometheus.Counter
	badChunks     prometheus.Counter
	peerDrops     *prometheus.CounterVec
	fetches       *prometheus.CounterVec
	fetchDuration prometheus.Histogram
	served        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		bytesSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "p2ptrain_artifact_sent_bytes_total",
			Help: "Chunk bytes served to peers.",
		}),
		bytesReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "p2ptrain_artifact_received_bytes_total",
			Help: "Chunk bytes received from peers, verified or not.",
		}),
		bytesResumed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "p2ptrain_artifact_resumed_bytes_total",
			Help: "Bytes of partial downloads that re-verified on resume and were not fetched again.",
		}),
		badChunks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "p2ptrain_artifact_bad_chunks_total",
			Help: "Chunks received that did not hash to their CID (or had the wrong length).",
		}),
		peerDrops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_artifact_peer_drops_total",
			Help: "Peers dropped from a fetch, by outcome; bad_chunk, bad_manifest and protocol also penalise the peer.",
		}, []string{"outcome"}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_artifact_fetches_total",
			Help: "Fetch calls by outcome.",
		}, []string{"outcome"}),
		fetchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "p2ptrain_artifact_fetch_duration_seconds",
			Help:    "Time to download and install an artifact (successful downloads).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12),
		}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_artifact_requests_served_total",
			Help: "Requests answered by the stream handler, by kind and result.",
		}, []string{"kind", "result"}),
	}
	m.bytesSent = promreg.Register(reg, m.bytesSent)
	m.bytesReceived = promreg.Register(reg, m.bytesReceived)
	m.bytesResumed = promreg.Register(reg, m.bytesResumed)
	m.badChunks = promreg.Register(reg, m.badChunks)
	m.peerDrops = promreg.Register(reg, m.peerDrops)
	m.fetches = promreg.Register(reg, m.fetches)
	m.fetchDuration = promreg.Register(reg, m.fetchDuration)
	m.served = promreg.Register(reg, m.served)
	// Start the outcome series at 0, so that a panel of failures shows zeros, not "No data".
	for _, o := range []string{fetchOK, fetchPresent, fetchNotFound, fetchCanceled, fetchFailed} {
		m.fetches.WithLabelValues(o)
	}
	for _, o := range []string{peerBadChunk, peerBadManifest, peerProtocol, peerStalled, peerGone, peerNotFound, peerRefused} {
		m.peerDrops.WithLabelValues(o)
	}
	return m
}
