package pyruntime

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Instrument wraps a runtime so that every call is timed in Prometheus
// (p2ptrain_pyruntime_call_seconds{method,outcome}) and its restarts are exported
// (p2ptrain_pyruntime_restarts_total), on the given registry.
func Instrument(rt Runtime, reg prometheus.Registerer) Runtime {
	m := &instrumented{Runtime: rt, calls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "p2ptrain_pyruntime_call_seconds",
		Help:    "Duration of calls into the Python runtime, by method and outcome.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 18),
	}, []string{"method", "outcome"})}
	restarts := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "p2ptrain_pyruntime_restarts_total",
		Help: "Times the Python worker was restarted after a crash or a hang.",
	}, func() float64 { return float64(rt.Status().Restarts) })
	for _, method := range []string{"start", "init", "train", "evaluate"} {
		m.calls.WithLabelValues(method, "ok")
		m.calls.WithLabelValues(method, "error")
	}
	reg.MustRegister(m.calls, restarts)
	return m
}

type instrumented struct {
	Runtime
	calls *prometheus.HistogramVec
}

func (m *instrumented) observe(method string, start time.Time, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.calls.WithLabelValues(method, outcome).Observe(time.Since(start).Seconds())
}

func (m *instrumented) Start(ctx context.Context) (Info, error) {
	start := time.Now()
	info, err := m.Runtime.Start(ctx)
	m.observe("start", start, err)
	return info, err
}

func (m *instrumented) Init(ctx context.Context, seed int64, out string) error {
	start := time.Now()
	err := m.Runtime.Init(ctx, seed, out)
	m.observe("init", start, err)
	return err
}

func (m *instrumented) Train(ctx context.Context, job TrainJob) (TrainResult, error) {
	start := time.Now()
	res, err := m.Runtime.Train(ctx, job)
	m.observe("train", start, err)
	return res, err
}

func (m *instrumented) Evaluate(ctx context.Context, pack string) (map[string]float64, error) {
	start := time.Now()
	res, err := m.Runtime.Evaluate(ctx, pack)
	m.observe("evaluate", start, err)
	return res, err
}
