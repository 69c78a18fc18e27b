package p2p

import (
	"context"
	"log/slog"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/gossip"
)

// NetBus is the Bus of a node on the network: messages travel on GossipSub, artifacts over
// the artifact protocol. It remembers who holds which artifact from what peers announce,
// so fetches go straight to holders.
type NetBus struct {
	g   *gossip.Gossip
	x   *artifact.Exchange
	log *slog.Logger
	// tags marks the trainers holding a lease in the connection manager (nil: no tagging).
	tags *leaseTags
	bus.Fanout
}

func NewNetBus(g *gossip.Gossip, x *artifact.Exchange, cm connmgr.ConnManager, log *slog.Logger) *NetBus {
	return &NetBus{g: g, x: x, log: log, tags: newLeaseTags(cm)}
}

// Run dispatches validated gossip to the inboxes until ctx ends.
func (b *NetBus) Run(ctx context.Context) {
	msgs := b.g.Messages()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			b.learnHolders(m.From, m.Msg)
			if l, ok := m.Msg.(*gossip.Leases); ok {
				b.tags.observe(l)
			}
			b.Deliver(m.From.String(), m.Msg)
		}
	}
}

// learnHolders records the artifacts a message says its author holds: as their origin
// (an update, a head), or as a copy (an announcement of the head's artifacts it keeps).
func (b *NetBus) learnHolders(from peer.ID, msg any) {
	add := func(raw []byte) {
		if c, err := cid.Cast(raw); err == nil {
			b.x.AddHolder(c, from)
		}
	}
	switch m := msg.(type) {
	case *gossip.Contribution:
		add(m.Delta)
	case *gossip.Head:
		if h, err := m.Signed.Decode(); err == nil {
			add(h.Params)
			add(h.OuterState)
			add(h.Reference)
		}
	case *gossip.Announce:
		for _, a := range m.Artifacts {
			if c, err := cid.Cast(a); err == nil {
				b.x.AddCopy(c, from)
			}
		}
	}
}

// Rejections reports the gossip messages rejected by topic validation, by "topic/reason".
func (b *NetBus) Rejections() map[string]uint64 { return b.g.Rejections() }

func (b *NetBus) Publish(ctx context.Context, msg any) error { return b.g.Publish(ctx, msg) }

// Reach is what gossip reaches now (Gossip.Reached).
func (b *NetBus) Reach(msg any) func(peer string) bool {
	reached := b.g.Reached(msg)
	return func(p string) bool {
		id, err := peer.Decode(p)
		return err == nil && reached[id]
	}
}

func (b *NetBus) Fetch(ctx context.Context, id cid.Cid, hints ...peer.ID) error {
	return b.x.Fetch(ctx, id, hints...)
}

func (b *NetBus) FetchAtMost(ctx context.Context, id cid.Cid, max uint64, hints ...peer.ID) error {
	return b.x.FetchAtMost(ctx, id, max, hints...)
}
