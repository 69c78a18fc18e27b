package node

import (
	"context"
	"log/slog"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/p2p"
)

// hostModule provides the libp2p host (p2p.NewHost) and its byte counters, or the host
// the caller gave in Options (without counters: nothing counts its bytes).
func hostModule(cfg *config.Config, opts Options) fx.Option {
	if opts.Host != nil {
		return fx.Module("host", fx.Provide(func() host.Host { return opts.Host }))
	}
	return fx.Module("host",
		fx.Provide(
			metrics.NewBandwidthCounter,
			p2p.NewByteCounter,
			fx.Annotate(
				func(key crypto.PrivKey, bc *p2p.ByteCounter, reg prometheus.Registerer, log *slog.Logger) (host.Host, error) {
					return p2p.NewHost(cfg, key, bc, reg, log)
				},
				fx.OnStop(func(_ context.Context, h host.Host) error { return h.Close() }),
			),
		),
		fx.Invoke(func(bw *metrics.BandwidthCounter, reg prometheus.Registerer) {
			reg.MustRegister(p2p.NewBandwidthCollector(bw))
		}),
		fx.Invoke(func(lc fx.Lifecycle, h host.Host, log *slog.Logger) {
			// Connections a peer behind NAT abandoned when its public address changed, and
			// AutoNAT's verdict, the NAT's kind and the relay reservations, as they come.
			ctx, cancel := context.WithCancel(context.Background())
			hlog := log.With("pkg", "host")
			lc.Append(fx.StartStopHook(func() error {
				p2p.WatchStaleConns(ctx, h, hlog)
				return p2p.WatchReachability(ctx, h, hlog)
			}, cancel))
		}),
		fx.Invoke(func(h host.Host, log *slog.Logger) {
			addrs := make([]string, 0, len(h.Addrs()))
			for _, a := range h.Addrs() {
				addrs = append(addrs, a.String()+"/p2p/"+h.ID().String())
			}
			log.With("pkg", "host").Info("listening", "peer", h.ID().String(), "addrs", strings.Join(addrs, " "))
		}),
	)
}
