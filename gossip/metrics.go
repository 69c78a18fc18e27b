package gossip

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the package's Prometheus collectors (prefix p2ptrain_gossip_). The topic
// label is the topic kind ("heads"), not the full name, to keep series few.
type metrics struct {
	messages      *prometheus.CounterVec // topic, result, reason: every validation outcome
	published     *prometheus.CounterVec // topic
	publishErrors *prometheus.CounterVec // topic, reason
	dropped       *prometheus.CounterVec // topic, reason: lost inside pubsub before or after validation
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_gossip_messages_total",
			Help: "Messages received (or published by us) by validation result (accept, reject, ignore) and reason.",
		}, []string{"topic", "result", "reason"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_gossip_published_total",
			Help: "Messages this node published.",
		}, []string{"topic"}),
		publishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_gossip_publish_errors_total",
			Help: "Publish calls that failed, by reason (a validation reason, or encode/send).",
		}, []string{"topic", "reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "p2ptrain_gossip_dropped_total",
			Help: "Messages pubsub dropped outside our validators: full queues, slow consumer, bad envelope signatures.",
		}, []string{"topic", "reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.messages, err = register(reg, m.messages)
	if err == nil {
		m.published, err = register(reg, m.published)
	}
	if err == nil {
		m.publishErrors, err = register(reg, m.publishErrors)
	}
	if err == nil {
		m.dropped, err = register(reg, m.dropped)
	}
	if err != nil {
		return nil, fmt.Errorf("register gossip metrics: %w", err)
	}
	return m, nil
}

// register adopts an identical collector already on reg, so a Gossip re-created on the same
// registry (a restart inside one process) keeps counting instead of failing.
func register(reg prometheus.Registerer, c *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing, nil
		}
	}
	return nil, err
}

func (m *metrics) outcome(k Kind, result, reason string) {
	m.messages.WithLabelValues(string(k), result, reason).Inc()
}
