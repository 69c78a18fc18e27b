package node

import (
	"context"
	"log/slog"

	"github.com/libp2p/go-libp2p/core/host"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/p2p"
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

func bootstrapModule(cfg *config.Config) fx.Option {
	return fx.Invoke(func(lc fx.Lifecycle, h host.Host, log *slog.Logger) error {
		peers, err := p2p.KeptPeers(cfg, validatorIDs(cfg, h.ID()), h.ID())
		if err != nil || len(peers) == 0 {
			return err
		}
		p2p.ProtectKeptPeers(h, peers)
		// Watch connections from now on, before anything dials: the addresses a
		// validator was reached at are remembered from its first connection.
		w := p2p.WatchKept(h, peers)
		runInBackground(lc, func(ctx context.Context) { w.Keep(ctx, log.With("pkg", "bootstrap")) },
			func() error { w.Close(); return nil })
		return nil
	})
}

func dhtModule(cfg *config.Config) fx.Option {
	if !cfg.Node.DHT {
		return fx.Options()
	}
	return fx.Invoke(func(lc fx.Lifecycle, h host.Host, log *slog.Logger) error {
		peers, err := p2p.BootstrapPeers(cfg)
		if err != nil {
			return err
		}
		log = log.With("pkg", "dht")
		ctx, cancel := context.WithCancel(context.Background())
		d, err := p2p.NewDHT(ctx, h, cfg, peers)
		if err != nil {
			cancel()
			return err
		}
		// The loop stops on the hook's context; the DHT's own context ends after it.
		runInBackground(lc, func(loop context.Context) { p2p.RendezvousLoop(loop, h, d, p2p.Rendezvous(cfg), log) },
			func() error { cancel(); return d.Close() })
		return nil
	})
}

func mdnsModule(cfg *config.Config) fx.Option {
	if !cfg.Node.MDNS {
		return fx.Options()
	}
	return fx.Invoke(func(lc fx.Lifecycle, h host.Host, log *slog.Logger) {
		svc := p2p.NewMDNS(h, cfg, log.With("pkg", "mdns"))
		lc.Append(fx.Hook{
			OnStart: func(context.Context) error { return svc.Start() },
			OnStop:  func(context.Context) error { return svc.Close() },
		})
	})
}
