package p2p

import (
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
)

// ByteCounter is the host's bandwidth reporter: libp2p's counter, which the per-protocol
// metrics read, with exact totals beside it for the per-round bytes of the status page.
// The counter's own totals (go-flow-metrics) advance once a second, so a round shorter
// than that counted 0 bytes and the next one both rounds'.
type ByteCounter struct {
	*metrics.BandwidthCounter
	in, out atomic.Int64
}

func NewByteCounter(bw *metrics.BandwidthCounter) *ByteCounter {
	return &ByteCounter{BandwidthCounter: bw}
}

func (c *ByteCounter) LogSentMessage(n int64) {
	c.out.Add(n)
	c.BandwidthCounter.LogSentMessage(n)
}

func (c *ByteCounter) LogRecvMessage(n int64) {
	c.in.Add(n)
	c.BandwidthCounter.LogRecvMessage(n)
}

// BandwidthCollector exports libp2p's per-protocol byte counters as
// p2ptrain_node_protocol_bytes_total{protocol,direction}.
type BandwidthCollector struct {
	bw   *metrics.BandwidthCounter
	desc *prometheus.Desc
}

func NewBandwidthCollector(bw *metrics.BandwidthCounter) *BandwidthCollector {
	return &BandwidthCollector{bw: bw, desc: prometheus.NewDesc("p2ptrain_node_protocol_bytes_total",
		"Bytes sent and received over libp2p streams, by protocol.", []string{"protocol", "direction"}, nil)}
}

func (c *BandwidthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// bulkProtocols carry the node's bytes (artifacts, head sync); their series exist from the
// start, at 0, so a bytes panel shows zeros rather than "No data" before the first transfer.
var bulkProtocols = []protocol.ID{artifact.ProtocolID, chain.SyncProtocol}

func (c *BandwidthCollector) Collect(ch chan<- prometheus.Metric) {
	seen := c.bw.GetBandwidthByProtocol()
	for _, p := range bulkProtocols {
		if _, ok := seen[p]; !ok {
			seen[p] = metrics.Stats{}
		}
	}
	for proto, s := range seen {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(s.TotalIn), string(proto), "in")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(s.TotalOut), string(proto), "out")
	}
}

// RegisterPeersGauge exports p2ptrain_node_peers, the number of peers the host is connected to.
func RegisterPeersGauge(h host.Host, reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "p2ptrain_node_peers",
		Help: "Peers this node has at least one open connection to.",
	}, func() float64 { return float64(len(h.Network().Peers())) }))
}

// ByteMeter reports the bytes sent and received since its last reading (all zero
// without a counter: a host the node did not build).
type ByteMeter struct {
	c        *ByteCounter
	in, out  int64
	notFirst bool
}

// Delta is what was received and sent since the last call (zero on the first).
func (m *ByteMeter) Delta() (in, out uint64) {
	if m == nil || m.c == nil {
		return 0, 0
	}
	tin, tout := m.c.in.Load(), m.c.out.Load()
	if m.notFirst {
		in, out = uint64(max(0, tin-m.in)), uint64(max(0, tout-m.out))
	}
	m.in, m.out, m.notFirst = tin, tout, true
	return in, out
}

// NewByteMeter reads c (nil: no counter).
func NewByteMeter(c *ByteCounter) *ByteMeter { return &ByteMeter{c: c} }
