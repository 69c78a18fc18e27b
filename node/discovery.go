package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/discovery/mdns"
	drouting "github.com/libp2p/go-libp2p/p2p/discovery/routing"
	dutil "github.com/libp2p/go-libp2p/p2p/discovery/util"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/config"
)

// discoveryModule finds peers: the configured bootstrap peers (kept connected), the
// configured validators (kept connected too), the Kademlia DHT (rendezvous on the
// experiment's namespace) and mDNS on the LAN. Each is an
// empty option when switched off; all are off for an injected (test) host.
func discoveryModule(cfg *config.Config, opts Options) fx.Option {
	if opts.Host != nil {
		return fx.Options()
	}
	return fx.Module("discovery",
		bootstrapModule(cfg),
		dhtModule(cfg),
		mdnsModule(cfg),
	)
}

// bootstrapPeers parses node.bootstrap (validated already).
func bootstrapPeers(cfg *config.Config) ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for i, s := range cfg.Node.Bootstrap {
		ai, err := peer.AddrInfoFromString(s)
		if err != nil {
			return nil, fmt.Errorf("node.bootstrap[%d]: %w", i, err)
		}
		out = append(out, *ai)
	}
	return out, nil
}

// keptPeers are the peers a node keeps connected: the bootstrap peers (with their
// configured addresses) and the configured validators other than itself (dialled at the
// addresses the peerstore has learnt for them).
func keptPeers(cfg *config.Config, self peer.ID) ([]peer.AddrInfo, error) {
	peers, err := bootstrapPeers(cfg)
	if err != nil {
		return nil, err
	}
	for _, id := range validatorIDs(cfg, self) {
		if id != self && !slices.ContainsFunc(peers, func(ai peer.AddrInfo) bool { return ai.ID == id }) {
			peers = append(peers, peer.AddrInfo{ID: id})
		}
	}
	return peers, nil
}

func bootstrapModule(cfg *config.Config) fx.Option {
	return fx.Invoke(func(lc fx.Lifecycle, h host.Host, log *slog.Logger) error {
		peers, err := keptPeers(cfg, h.ID())
		if err != nil || len(peers) == 0 {
			return err
		}
		protectKeptPeers(h, peers)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		lc.Append(fx.Hook{
			OnStart: func(context.Context) error {
				go func() {
					defer close(done)
					keepConnected(ctx, h, peers, log.With("pkg", "bootstrap"))
				}()
				return nil
			},
			OnStop: func(context.Context) error { cancel(); <-done; return nil },
		})
		return nil
	})
}

// Redial pacing for kept peers. They are few and the swarm cannot work without them, so a
// node keeps trying twice a second: a restarted validator is reached within a
// second or two of listening again, where libp2p's own dial backoff (5 s and growing)
// and a backoff of ours growing to 30 s had trainers wait several round deadlines.
const (
	keepTick        = 250 * time.Millisecond
	keepMinBackoff  = 250 * time.Millisecond
	keepMaxBackoff  = 500 * time.Millisecond
	keepDialTimeout = 10 * time.Second
)

// keptPeer is the redial state of one kept peer.
type keptPeer struct {
	ai      peer.AddrInfo
	backoff time.Duration
	next    time.Time
	dialing bool
}

// keepConnected dials the kept peers at start and again whenever a connection drops,
// each in its own goroutine so that a peer whose dials hang does not delay the others.
func keepConnected(ctx context.Context, h host.Host, peers []peer.AddrInfo, log *slog.Logger) {
	state := make(map[peer.ID]*keptPeer, len(peers))
	for _, ai := range peers {
		if ai.ID != h.ID() {
			state[ai.ID] = &keptPeer{ai: ai}
		}
	}
	results := make(chan peer.ID)
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(keepTick)
	defer t.Stop()
	for {
		now := time.Now()
		for id, k := range state {
			if k.dialing || now.Before(k.next) || h.Network().Connectedness(id) == network.Connected {
				continue
			}
			if len(k.ai.Addrs) == 0 && len(h.Peerstore().Addrs(id)) == 0 {
				continue // a validator we have not learnt an address for yet
			}
			k.dialing = true
			wg.Go(func() {
				dialKept(ctx, h, k.ai, log)
				select {
				case results <- k.ai.ID:
				case <-ctx.Done():
				}
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case id := <-results:
			k := state[id]
			k.dialing = false
			if h.Network().Connectedness(id) == network.Connected {
				k.backoff = 0
				continue
			}
			k.backoff = min(max(2*k.backoff, keepMinBackoff), keepMaxBackoff)
			k.next = time.Now().Add(k.backoff)
		}
	}
}

// dialKept dials a kept peer, first clearing the swarm's dial backoff for it: that
// backoff was set by dials that failed while the peer was down, and would refuse this
// dial for seconds after the peer is back.
func dialKept(ctx context.Context, h host.Host, ai peer.AddrInfo, log *slog.Logger) {
	if sw, ok := h.Network().(interface{ Backoff() *swarm.DialBackoff }); ok {
		sw.Backoff().Clear(ai.ID)
	}
	dctx, cancel := context.WithTimeout(ctx, keepDialTimeout)
	defer cancel()
	if err := h.Connect(dctx, ai); err != nil {
		log.Debug("dial of a bootstrap peer or validator failed", "peer", ai.ID.String(), "err", err)
		return
	}
	log.Info("connected to a bootstrap peer or validator", "peer", ai.ID.String())
}

func dhtModule(cfg *config.Config) fx.Option {
	if !cfg.Node.DHT {
		return fx.Options()
	}
	rendezvous := "/p2ptrain/" + cfg.Experiment.Network + "/" + cfg.Experiment.ID
	return fx.Invoke(func(lc fx.Lifecycle, h host.Host, log *slog.Logger) error {
		peers, err := bootstrapPeers(cfg)
		if err != nil {
			return err
		}
		log = log.With("pkg", "dht")
		ctx, cancel := context.WithCancel(context.Background())
		d, err := dht.New(ctx, h, dht.Mode(dht.ModeAutoServer), dht.ProtocolPrefix(protocol.ID("/p2ptrain/"+cfg.Experiment.Network)),
			dht.BootstrapPeers(peers...))
		if err != nil {
			cancel()
			return fmt.Errorf("node.dht: %w", err)
		}
		done := make(chan struct{})
		lc.Append(fx.Hook{
			OnStart: func(context.Context) error {
				go func() {
					defer close(done)
					rendezvousLoop(ctx, h, d, rendezvous, log)
				}()
				return nil
			},
			OnStop: func(context.Context) error {
				cancel()
				<-done
				return d.Close()
			},
		})
		return nil
	})
}

// rendezvousLoop advertises this node under the experiment's namespace and connects to the
// other nodes found there, so a swarm grows beyond its bootstrap peers.
func rendezvousLoop(ctx context.Context, h host.Host, d *dht.IpfsDHT, ns string, log *slog.Logger) {
	disc := drouting.NewRoutingDiscovery(d)
	for {
		if err := d.Bootstrap(ctx); err == nil && len(d.RoutingTable().ListPeers()) > 0 {
			dutil.Advertise(ctx, disc, ns)
			peers, err := disc.FindPeers(ctx, ns)
			if err == nil {
				for ai := range peers {
					if ai.ID == h.ID() || len(ai.Addrs) == 0 || h.Network().Connectedness(ai.ID) == network.Connected {
						continue
					}
					cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					if err := h.Connect(cctx, ai); err == nil {
						log.Debug("connected to a peer found in the DHT", "peer", ai.ID.String())
					}
					cancel()
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(30 * time.Second):
		}
	}
}

func mdnsModule(cfg *config.Config) fx.Option {
	if !cfg.Node.MDNS {
		return fx.Options()
	}
	return fx.Invoke(func(lc fx.Lifecycle, h host.Host, log *slog.Logger) {
		n := &mdnsNotifee{h: h, log: log.With("pkg", "mdns")}
		svc := mdns.NewMdnsService(h, "p2ptrain-"+cfg.Experiment.Network, n)
		lc.Append(fx.Hook{
			OnStart: func(context.Context) error { return svc.Start() },
			OnStop:  func(context.Context) error { return svc.Close() },
		})
	})
}

type mdnsNotifee struct {
	h   host.Host
	log *slog.Logger
}

// HandlePeerFound connects to peers found on the LAN.
func (n *mdnsNotifee) HandlePeerFound(ai peer.AddrInfo) {
	if ai.ID == n.h.ID() {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.h.Connect(ctx, ai); err == nil {
			n.log.Info("connected to a peer on the LAN", "peer", ai.ID.String())
		}
	}()
}
