package status

import (
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/internal/version"
	"github.com/p2pnode/p2pnode/trainer"
	"github.com/p2pnode/p2pnode/validator"
)

// NewRegistry is the node's Prometheus registry: the metrics of every package, plus the Go
// runtime and process collectors and p2ptrain_build_info.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "p2ptrain_build_info",
		Help: "Always 1; the labels say which build of p2pnode is running.",
		ConstLabels: prometheus.Labels{
			"version": version.Version, "revision": version.Revision(), "goversion": runtime.Version(),
		},
	})
	buildInfo.Set(1)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo,
	)
	return reg
}

// Metrics are the role loops' Prometheus metrics (prefix p2ptrain_node_). docs/metrics.md
// lists them; docs/grafana/p2pnode.json is built on them.
type Metrics struct {
	// Leader.
	rounds    prometheus.Counter
	roundSecs prometheus.Histogram
	phaseSecs *prometheus.HistogramVec
	merged    prometheus.Counter
	// Validators.
	rejects *prometheus.CounterVec
	// Every node, from the canonical head it follows.
	round     prometheus.Gauge
	trainLoss prometheus.Gauge
	heldOut   *heldOutCollector
	ended     *prometheus.CounterVec
	dropped   *prometheus.CounterVec
	// Trainer.
	contributions prometheus.Counter
	trainSecs     prometheus.Counter
	samples       prometheus.Counter
	lastLoss      prometheus.Gauge
	windows       *prometheus.CounterVec
	// Every node's store (prune.go).
	PrunedArtifacts prometheus.Counter
	PrunedBytes     prometheus.Counter
}

func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "p2ptrain_node_rounds_closed_total",
			Help: "Rounds this node closed as leader (a head proposed)."}),
		roundSecs: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "p2ptrain_node_round_duration_seconds",
			Help: "Wall time of rounds this node led, from first lease to proposed head.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 16)}),
		phaseSecs: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "p2ptrain_node_round_phase_seconds",
			Help:    "Time of the rounds this node led by phase (the round notes' split): training, communication, merge.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 18)}, []string{"phase"}),
		merged: prometheus.NewCounter(prometheus.CounterOpts{Name: "p2ptrain_node_contributions_merged_total",
			Help: "Contributions merged into heads this node proposed as leader."}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "p2ptrain_node_contributions_rejected_total",
			Help: "Contributions (and proposals) rejected by this validator, by reason."}, []string{"reason"}),
		round: prometheus.NewGauge(prometheus.GaugeOpts{Name: "p2ptrain_node_head_round",
			Help: "Round of the canonical head."}),
		trainLoss: prometheus.NewGauge(prometheus.GaugeOpts{Name: "p2ptrain_node_head_train_loss",
			Help: "Training loss recorded in the canonical head (sample-weighted mean of its contributions)."}),
		heldOut: newHeldOutCollector(),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "p2ptrain_node_leases_failed_total",
			Help: "Leases this node granted that came to nothing, by how: expired (no report by the deadline), released (the trainer gave it back) or gone (the trainer restarted or fell silent while holding it)."}, []string{"how"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "p2ptrain_node_metrics_dropped_total",
			Help: "Held-out metric values dropped because they were not finite (NaN or ±Inf), by metric."}, []string{"metric"}),
		contributions: prometheus.NewCounter(prometheus.CounterOpts{Name: "p2ptrain_node_contributions_total",
			Help: "Contributions this node trained and announced as a trainer."}),
		trainSecs: prometheus.NewCounter(prometheus.CounterOpts{Name: "p2ptrain_node_train_seconds_total",
			Help: "Seconds the worker spent in inner steps; its rate is the trainer's utilization (0..1)."}),
		samples: prometheus.NewCounter(prometheus.CounterOpts{Name: "p2ptrain_node_train_samples_total",
			Help: "Samples this node trained on."}),
		lastLoss: prometheus.NewGauge(prometheus.GaugeOpts{Name: "p2ptrain_node_train_loss",
			Help: "Mean training loss of this node's last contribution."}),
		windows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "p2ptrain_node_overlap_windows_total",
			Help: "Windows this trainer trained under protocol.overlap: eager, by how: ahead (from its guess at the head, before the lease came) or base (from the head, after the lease came: nothing trained ahead fitted it)."}, []string{"trained"}),
		PrunedArtifacts: prometheus.NewCounter(prometheus.CounterOpts{Name: "p2ptrain_node_store_pruned_artifacts_total",
			Help: "Artifacts deleted from the store because no kept head, checkpoint or recent round needs them (node.keep_heads)."}),
		PrunedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "p2ptrain_node_store_pruned_bytes_total",
			Help: "Bytes of the artifacts deleted from the store by pruning."}),
	}
	for _, r := range validator.RejectReasons {
		m.rejects.WithLabelValues(r)
	}
	for _, how := range []string{"expired", "released", "gone"} {
		m.ended.WithLabelValues(how)
	}
	for _, phase := range RoundPhases {
		m.phaseSecs.WithLabelValues(phase)
	}
	reg.MustRegister(m.rounds, m.roundSecs, m.phaseSecs, m.merged, m.rejects, m.round, m.trainLoss, m.heldOut,
		m.contributions, m.trainSecs, m.samples, m.lastLoss, m.windows, m.ended, m.dropped, m.PrunedArtifacts, m.PrunedBytes)
	return m
}

func (m *Metrics) Rejected(reason string) { m.rejects.WithLabelValues(reason).Inc() }

func (m *Metrics) LeaseEnded(how string) { m.ended.WithLabelValues(how).Inc() }

func (m *Metrics) MetricDropped(name string) { m.dropped.WithLabelValues(name).Inc() }

// RoundPhases are the values of p2ptrain_node_round_phase_seconds' phase label.
var RoundPhases = []string{"training", "communication", "merge"}

// RoundSplit observes the time split of a round this node led (its notes).
func (m *Metrics) RoundSplit(n *chain.Notes) {
	for i, s := range []float64{n.TrainSeconds, n.CommSeconds, n.MergeSeconds} {
		m.phaseSecs.WithLabelValues(RoundPhases[i]).Observe(s)
	}
}

func (m *Metrics) RoundClosed(took time.Duration, merged int) {
	m.rounds.Inc()
	m.roundSecs.Observe(took.Seconds())
	m.merged.Add(float64(merged))
}

func (m *Metrics) Trained(samples uint64, trainSeconds, loss float64, w trainer.WindowKind) {
	m.contributions.Inc()
	if w.Overlap {
		how := "base"
		if w.Ahead {
			how = "ahead"
		}
		m.windows.WithLabelValues(how).Inc()
	}
	m.samples.Add(float64(samples))
	if trainSeconds > 0 {
		m.trainSecs.Add(trainSeconds)
	}
	m.lastLoss.Set(loss)
}

func (m *Metrics) Head(round uint64, trainLoss float64, heldOut map[string]float64) {
	m.round.Set(float64(round))
	m.trainLoss.Set(trainLoss)
	m.heldOut.set(heldOut)
}

// heldOutCollector exports each held-out metric of the canonical head as its own gauge,
// p2ptrain_node_head_heldout_<name> (loss, accuracy, ... as the workload's evaluate names
// them), so that a loss and an accuracy never share one series. A name appears once a
// head carries it, and a metric the newest head lacks is dropped rather than left stale.
type heldOutCollector struct {
	mu     sync.Mutex
	values map[string]float64
}

// HeldOutPrefix begins the name of each held-out metric gauge.
const HeldOutPrefix = "p2ptrain_node_head_heldout_"

func newHeldOutCollector() *heldOutCollector { return &heldOutCollector{} }

func (c *heldOutCollector) set(metrics map[string]float64) {
	if len(metrics) == 0 {
		return // a head nobody evaluated (yet): keep the last measured values
	}
	values := make(map[string]float64, len(metrics))
	for k, v := range metrics {
		if name := heldOutMetricName(k); name != "" {
			values[name] = v
		}
	}
	c.mu.Lock()
	c.values = values
	c.mu.Unlock()
}

// Describe sends nothing: the names depend on the workload, which makes this an unchecked
// collector.
func (c *heldOutCollector) Describe(chan<- *prometheus.Desc) {}

func (c *heldOutCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, v := range c.values {
		desc := prometheus.NewDesc(name, "Held-out "+strings.TrimPrefix(name, HeldOutPrefix)+
			" of the canonical head, as the workload's evaluate reports it.", nil, nil)
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v)
	}
}

// heldOutMetricName maps a workload's metric key ("loss", "top-1 acc") to a valid metric
// name; "" for a key with nothing usable in it.
func heldOutMetricName(key string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(key) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := strings.Trim(b.String(), "_")
	if s == "" {
		return ""
	}
	return HeldOutPrefix + s
}
