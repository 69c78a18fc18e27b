package node

import (
	"context"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/headsync"
)

// headsLoop is head sync (package headsync) wired to this node: every node runs it.
type headsLoop struct{ *env }

func (*headsLoop) name() string { return "heads" }

func (l *headsLoop) run(ctx context.Context, _ *startup) error { return newHeadSync(l.env).Run(ctx) }

func newHeadSync(e *env) *headsync.Sync {
	return headsync.New(headsync.Params{Experiment: e.cfg.Experiment.ID, Self: e.self, IsValidator: e.isValidator,
		Bus: e.bus, Tips: e.tips, Heads: e.heads, Peers: hostPeers{e.host}, FetchArtifacts: e.fetchHeadArtifacts,
		Seen: e.peers.Seen, Progress: e.work, Log: e.log})
}

// hostPeers is the libp2p host's connected peers and the chain sync protocol over it.
type hostPeers struct{ h host.Host }

func (p hostPeers) Connected() []peer.ID { return p.h.Network().Peers() }

func (p hostPeers) Reachable(id peer.ID) bool {
	c := p.h.Network().Connectedness(id)
	return c == network.Connected || c == network.Limited
}

func (p hostPeers) RequestTip(ctx context.Context, id peer.ID) (*chain.Fetched, error) {
	return chain.RequestTip(ctx, p.h, id)
}

func (p hostPeers) RequestHead(ctx context.Context, id peer.ID, head cid.Cid) (*chain.Fetched, error) {
	return chain.RequestHead(ctx, p.h, id, head)
}
