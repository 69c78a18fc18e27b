package export

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/p2pnode/p2pnode/internal/promreg"
)

// metrics are the background writer's; one-off exports (the CLI) have none.
type metrics struct {
	runs       *prometheus.CounterVec
	superseded prometheus.Counter
	written    prometheus.Counter
	changed    prometheus.Counter
	lastRound  prometheus.Gauge
	duration   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_export_runs_total",
			Help: "Background exports of the model directory, by result (ok, error).",
		}, []string{"result"}),
		superseded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "p2ptrain_export_superseded_total",
			Help: "Submitted heads never written because a newer one arrived first.",
		}),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "p2ptrain_export_written_bytes_total",
			Help: "Bytes written to the model directory, journal included.",
		}),
		changed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "p2ptrain_export_changed_bytes_total",
			Help: "Bytes of blocks that differed in in-place syncs.",
		}),
		lastRound: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "p2ptrain_export_last_round",
			Help: "Round of the head the model directory holds.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "p2ptrain_export_duration_seconds",
			Help:    "Time of one background export.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12),
		}),
	}
	if reg == nil {
		return m
	}
	m.runs = promreg.Register(reg, m.runs)
	m.superseded = promreg.Register(reg, m.superseded)
	m.written = promreg.Register(reg, m.written)
	m.changed = promreg.Register(reg, m.changed)
	m.lastRound = promreg.Register(reg, m.lastRound)
	m.duration = promreg.Register(reg, m.duration)
	return m
}
