package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
)

// Params configures New. Tuning knobs are fields, never package globals: several nodes
// share one process in tests and benchmarks.
type Params struct {
	Host       host.Host
	Network    string // experiment namespace
	Experiment string
	// Validators may publish heads, leases and attestations. Empty means nobody may.
	Validators []peer.ID
	Logger     *slog.Logger          // default slog.Default() with pkg=gossip
	Registerer prometheus.Registerer // nil: metrics are kept but not exported

	// QueueSize is the per-peer outbound queue, the validation queue and each
	// subscription's buffer (default 1024). At pubsub's default of 32 a burst of 100
	// messages loses most of them (docs: ENVIRONMENT.md, GossipSub measurements).
	QueueSize int
	// OutboxSize buffers Messages() (default 1024).
	OutboxSize int
	// MaxClockSkew is how far an announce's time may be from ours, and how long after its
	// deadline a lease grant is still delivered (default 2 minutes).
	MaxClockSkew time.Duration
	// SeenTTL is how long a message id is remembered as seen (default 5 minutes: longer
	// than the announce window, so a replayed announce is either a duplicate or stale).
	SeenTTL time.Duration
	// GossipSub overrides the router parameters (nil: pubsub's defaults).
	GossipSub *pubsub.GossipSubParams
	// PubSubOptions are applied after ours (tests and benchmarks: tracers, scoring).
	PubSubOptions []pubsub.Option
	// Now is the clock for staleness checks (default time.Now).
	Now func() time.Time
}

const (
	defaultQueueSize    = 1024
	defaultOutboxSize   = 1024
	defaultMaxClockSkew = 2 * time.Minute
	defaultSeenTTL      = 5 * time.Minute

	// envelopeBytes is the room on the wire around the biggest message: the pubsub
	// envelope (author, sequence number, key, signature, topic) and RPC framing.
	envelopeBytes = 64 << 10
)

// ErrBadParams is wrapped by New's errors about its parameters.
var ErrBadParams = errors.New("bad gossip params")

func (p *Params) withDefaults() (Params, error) {
	q := *p
	switch {
	case q.Host == nil:
		return q, fmt.Errorf("%w: host is required", ErrBadParams)
	case !validSegment(q.Network):
		return q, fmt.Errorf("%w: network %q must be non-empty without '/'", ErrBadParams, q.Network)
	case !validSegment(q.Experiment):
		return q, fmt.Errorf("%w: experiment %q must be non-empty without '/'", ErrBadParams, q.Experiment)
	case q.QueueSize < 0 || q.OutboxSize < 0 || q.MaxClockSkew < 0 || q.SeenTTL < 0:
		return q, fmt.Errorf("%w: sizes and durations must not be negative", ErrBadParams)
	}
	if q.Logger == nil {
		q.Logger = slog.Default().With("pkg", "gossip")
	}
	if q.QueueSize == 0 {
		q.QueueSize = defaultQueueSize
	}
	if q.OutboxSize == 0 {
		q.OutboxSize = defaultOutboxSize
	}
	if q.MaxClockSkew == 0 {
		q.MaxClockSkew = defaultMaxClockSkew
	}
	if q.SeenTTL == 0 {
		q.SeenTTL = defaultSeenTTL
	}
	if q.Now == nil {
		q.Now = time.Now
	}
	return q, nil
}

// validSegment keeps topic names unambiguous: "/p2ptrain/<network>/<experiment>/<kind>".
func validSegment(s string) bool { return s != "" && !strings.Contains(s, "/") }
