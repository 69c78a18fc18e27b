package gossip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("gossip closed")

// Message is a validated message as subscribers receive it.
type Message struct {
	From  peer.ID // the author (StrictSign-verified), not the peer that relayed it
	Topic string
	Msg   any // *Announce, *Leases, *Contribution, *Head, *Attestation or *Release
}

// Gossip is a node's GossipSub presence in one experiment: every topic joined, validated
// and subscribed.
type Gossip struct {
	log     *slog.Logger
	host    host.Host
	self    peer.ID
	check   *checker
	metrics *metrics
	rejects *rejectLog
	topics  map[Kind]*pubsub.Topic
	out     chan Message

	ctx       context.Context // lives until Close; pubsub runs on it
	cancel    context.CancelFunc
	readers   sync.WaitGroup
	closeOnce sync.Once
}

// New starts GossipSub on the host, joins every topic of the experiment, registers each
// topic's validator and subscribes. The pubsub instance lives until Close or until ctx ends.
func New(ctx context.Context, p Params) (*Gossip, error) {
	p, err := p.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(p.Registerer)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	g := &Gossip{
		log:     p.Logger,
		host:    p.Host,
		self:    p.Host.ID(),
		check:   &checker{network: p.Network, experiment: p.Experiment, maxSkew: p.MaxClockSkew, now: p.Now},
		metrics: m,
		rejects: newRejectLog(p.Logger),
		topics:  map[Kind]*pubsub.Topic{},
		out:     make(chan Message, p.OutboxSize),
		ctx:     ctx,
		cancel:  cancel,
	}
	g.check.setValidators(p.Validators)
	if err := g.start(p); err != nil {
		g.shutdown()
		return nil, fmt.Errorf("start gossip for %s/%s: %w", p.Network, p.Experiment, err)
	}
	g.log.Debug("gossip started", "network", p.Network, "experiment", p.Experiment, "validators", len(p.Validators))
	return g, nil
}

func (g *Gossip) start(p Params) error {
	names := map[string]Kind{}
	for _, k := range kinds {
		names[TopicName(p.Network, p.Experiment, string(k))] = k
	}
	opts := []pubsub.Option{
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithMessageIdFn(contentID), // each topic sets its own rule below; see msgid.go
		pubsub.WithMaxMessageSize(maxTopicBytes() + envelopeBytes),
		pubsub.WithPeerOutboundQueueSize(p.QueueSize),
		pubsub.WithValidateQueueSize(p.QueueSize),
		pubsub.WithSeenMessagesTTL(p.SeenTTL),
		// Our own messages go to every connected subscriber, not only to the mesh (off by
		// default in this pubsub version): a head or lease reaches its neighbours in one hop,
		// and a message published before the first heartbeat builds the mesh is not lost.
		pubsub.WithFloodPublish(true),
		pubsub.WithRawTracer(&tracer{m: g.metrics, kindOf: names}),
		pubsub.WithLogger(slog.New(minLevel{p.Logger.Handler(), slog.LevelWarn}).With("lib", "pubsub")),
	}
	if p.GossipSub != nil {
		opts = append(opts, pubsub.WithGossipSubParams(*p.GossipSub))
	}
	opts = append(opts, p.PubSubOptions...)
	ps, err := pubsub.NewGossipSub(g.ctx, p.Host, opts...)
	if err != nil {
		return fmt.Errorf("new gossipsub: %w", err)
	}
	for name, k := range names {
		t, err := ps.Join(name, pubsub.WithTopicMessageIdFn(k.idFunc()))
		if err != nil {
			return fmt.Errorf("join %s: %w", name, err)
		}
		g.topics[k] = t
		// The validator goes in before the subscription, so nothing is ever delivered
		// unvalidated.
		if err := ps.RegisterTopicValidator(name, g.validator(k)); err != nil {
			return fmt.Errorf("register validator for %s: %w", name, err)
		}
		sub, err := t.Subscribe(pubsub.WithBufferSize(p.QueueSize))
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", name, err)
		}
		g.readers.Add(1)
		go g.read(sub)
	}
	return nil
}

// read forwards one topic's messages in arrival order; it blocks on a full outbox, and
// pubsub then drops for the subscription (counted as slow_consumer) rather than stalling.
func (g *Gossip) read(sub *pubsub.Subscription) {
	defer g.readers.Done()
	for {
		m, err := sub.Next(g.ctx)
		if err != nil {
			return // closed
		}
		if m.ValidatorData == nil {
			continue // cannot happen: our validator stores the decoded value of every accept
		}
		select {
		case g.out <- Message{From: m.GetFrom(), Topic: sub.Topic(), Msg: m.ValidatorData}:
		case <-g.ctx.Done():
			return
		}
	}
}

// Messages returns every validated message from every topic, our own included, in the
// order pubsub delivers them per topic (GossipSub itself does not keep publish order across
// paths). It has one consumer and is closed by Close.
func (g *Gossip) Messages() <-chan Message { return g.out }

// Rejections returns how many messages from peers this node's topic validators rejected
// (forged or malformed), by "topic/reason" (e.g. "contributions/author_mismatch").
func (g *Gossip) Rejections() map[string]uint64 { return g.rejects.rejections() }

// SetValidators replaces the set of peers allowed to publish heads, leases and
// attestations. It applies to every message validated after it returns.
func (g *Gossip) SetValidators(ids []peer.ID) { g.check.setValidators(ids) }

// Publish encodes msg, checks it against the same rules peers will apply, and publishes it
// on its topic. A message we published before (same bytes) is not delivered again.
func (g *Gossip) Publish(ctx context.Context, msg any) error {
	k, err := kindOf(msg)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	if g.ctx.Err() != nil {
		return fmt.Errorf("publish %s: %w", k, ErrClosed)
	}
	b, err := Encode(msg)
	if err != nil {
		g.metrics.publishErrors.WithLabelValues(string(k), "encode").Inc()
		return fmt.Errorf("publish %s: encode: %w", k, err)
	}
	v, o := g.check.check(k, g.self, b)
	if o != nil {
		g.metrics.publishErrors.WithLabelValues(string(k), o.reason).Inc()
		return fmt.Errorf("publish %s: %w", k, o)
	}
	// The checked value rides along, so our validator does not decode our own message again.
	if err := g.topics[k].Publish(ctx, b, pubsub.WithValidatorData(v)); err != nil {
		g.metrics.publishErrors.WithLabelValues(string(k), "send").Inc()
		if g.ctx.Err() != nil {
			err = ErrClosed
		}
		return fmt.Errorf("publish %s: %w", k, err)
	}
	g.metrics.published.WithLabelValues(string(k)).Inc()
	return nil
}

// Reached returns the peers that a message of msg's type, published now, goes to from this
// node: the connected peers whose subscription to its topic has arrived, and this node. A
// value that is not one of our message types reaches nobody.
func (g *Gossip) Reached(msg any) map[peer.ID]bool {
	k, err := kindOf(msg)
	if err != nil {
		return nil
	}
	peers := g.topics[k].ListPeers()
	out := make(map[peer.ID]bool, len(peers)+1)
	for _, p := range peers {
		out[p] = true
	}
	out[g.self] = true
	return out
}

// Close stops pubsub, waits for the topic readers and closes Messages. It does not close
// the host.
func (g *Gossip) Close() error {
	g.shutdown()
	return nil
}

func (g *Gossip) shutdown() {
	g.closeOnce.Do(func() {
		g.cancel()
		g.readers.Wait()
		close(g.out)
		// Pubsub leaves its stream handlers on the host when it stops. Removing them makes
		// peers see a protocol error and drop us, instead of streaming into a dead instance
		// (and lets a new Gossip on the same host start clean).
		for _, id := range pubsub.GossipSubDefaultProtocols {
			g.host.RemoveStreamHandler(id)
		}
	})
}
