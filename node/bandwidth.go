package node

import (
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// bandwidthCollector exports libp2p's per-protocol byte counters as
// p2ptrain_node_protocol_bytes_total{protocol,direction}.
type bandwidthCollector struct {
	bw   *metrics.BandwidthCounter
	desc *prometheus.Desc
}

func newBandwidthCollector(bw *metrics.BandwidthCounter) *bandwidthCollector {
	return &bandwidthCollector{bw: bw, desc: prometheus.NewDesc("p2ptrain_node_protocol_bytes_total",
		"Bytes sent and received over libp2p streams, by protocol.", []string{"protocol", "direction"}, nil)}
}

func (c *bandwidthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *bandwidthCollector) Collect(ch chan<- prometheus.Metric) {
	for proto, s := range c.bw.GetBandwidthByProtocol() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(s.TotalIn), string(proto), "in")
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(s.TotalOut), string(proto), "out")
	}
}
