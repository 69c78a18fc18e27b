package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeMetrics are the role loops' Prometheus metrics (prefix p2ptrain_node_).
type nodeMetrics struct {
	rounds    prometheus.Counter
	roundSecs prometheus.Histogram
	rejects   *prometheus.CounterVec
	round     prometheus.Gauge
	heldOut   *prometheus.GaugeVec
	ended     *prometheus.CounterVec
	dropped   *prometheus.CounterVec
}

func newNodeMetrics(reg prometheus.Registerer) *nodeMetrics {
	m := &nodeMetrics{
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "p2ptrain_node_rounds_closed_total",
			Help: "Rounds this node closed as leader."}),
		roundSecs: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "p2ptrain_node_round_seconds",
			Help: "Wall time of rounds this node led, from first lease to head.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 16)}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "p2ptrain_node_contributions_rejected_total",
			Help: "Contributions rejected by this validator, by reason."}, []string{"reason"}),
		round: prometheus.NewGauge(prometheus.GaugeOpts{Name: "p2ptrain_node_head_round",
			Help: "Round of the canonical head."}),
		heldOut: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "p2ptrain_node_head_heldout",
			Help: "Held-out metrics of the canonical head, when measured."}, []string{"metric"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "p2ptrain_node_leases_failed_total",
			Help: "Leases this node granted that came to nothing, by how: expired (no report by the deadline) or released (the trainer gave it back)."}, []string{"how"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "p2ptrain_node_metrics_dropped_total",
			Help: "Held-out metric values dropped because they were not finite (NaN or ±Inf), by metric."}, []string{"metric"}),
	}
	reg.MustRegister(m.rounds, m.roundSecs, m.rejects, m.round, m.heldOut, m.ended, m.dropped)
	return m
}

func (m *nodeMetrics) rejected(reason string) { m.rejects.WithLabelValues(reason).Inc() }

func (m *nodeMetrics) leaseEnded(how string) { m.ended.WithLabelValues(how).Inc() }

func (m *nodeMetrics) metricDropped(name string) { m.dropped.WithLabelValues(name).Inc() }

func (m *nodeMetrics) roundClosed(took time.Duration) {
	m.rounds.Inc()
	m.roundSecs.Observe(took.Seconds())
}

func (m *nodeMetrics) head(round uint64, heldOut map[string]float64) {
	m.round.Set(float64(round))
	for k, v := range heldOut {
		m.heldOut.WithLabelValues(k).Set(v)
	}
}
