// Package promreg registers Prometheus collectors so that two components of one node (or
// several nodes of one test process) sharing a registry share equal collectors instead of
// failing: the second registration returns the collector already there.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register adds c to reg and returns the collector to use: c, or an equal one already
// registered. A clash with a different metric under the same name keeps c unregistered
// (it still counts, privately) rather than failing the node.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
