package node

import (
	"context"
	"fmt"
	"log/slog"
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
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/config"
)

// discoveryModule finds peers: the configured bootstrap peers (kept connected), the
// Kademlia DHT (rendezvous on the experiment's namespace) and mDNS on the LAN. Each is an
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

func bootstrapModule(cfg *config.Config) fx.Option {
	if len(cfg.Node.Bootstrap) == 0 {
		return fx.Options()
	}
	return fx.Invoke(func(lc fx.Lifecycle, h host.Host, log *slog.Logger) error {
		peers, err := bootstrapPeers(cfg)
		if err != nil {
			return err
		}
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

// keepConnected dials the bootstrap peers at start and again whenever a connection drops.
func keepConnected(ctx context.Context, h host.Host, peers []peer.AddrInfo, log *slog.Logger) {
	backoff := map[peer.ID]time.Duration{}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	next := map[peer.ID]time.Time{}
	for {
		var wg sync.WaitGroup
		var dialed []peer.ID
		for _, ai := range peers {
			if ai.ID == h.ID() || h.Network().Connectedness(ai.ID) == network.Connected || time.Now().Before(next[ai.ID]) {
				continue
			}
			dialed = append(dialed, ai.ID)
			wg.Add(1)
			go func(ai peer.AddrInfo) {
				defer wg.Done()
				dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := h.Connect(dctx, ai); err != nil {
					log.Debug("bootstrap dial failed", "peer", ai.ID.String(), "err", err)
					return
				}
				log.Info("connected to bootstrap peer", "peer", ai.ID.String())
			}(ai)
		}
		wg.Wait()
		// Back off only from peers this pass dialed in vain: moving the next attempt of a
		// peer that is waiting out its backoff would postpone it forever.
		for _, id := range dialed {
			if h.Network().Connectedness(id) == network.Connected {
				backoff[id] = 0
				continue
			}
			b := min(max(2*backoff[id], time.Second), 30*time.Second)
			backoff[id], next[id] = b, time.Now().Add(b)
		}
		for _, ai := range peers {
			if h.Network().Connectedness(ai.ID) == network.Connected {
				backoff[ai.ID] = 0 // a dropped connection is redialled at once
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
