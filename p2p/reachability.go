package p2p

import (
	"context"
	"log/slog"
	"strings"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
)

// WatchReachability logs, until ctx ends, what libp2p finds out about how peers reach this
// node: AutoNAT's verdict (public, or private: peers could not dial it back), the kind of
// NAT in front of it as the addresses peers observe show it (hole punching works through
// an endpoint-independent one), and the relayed addresses its relay reservations give it.
// A volunteer behind a home router reads there whether it was found private and reserved a
// slot; docs/wan.md has what each means for its updates.
func WatchReachability(ctx context.Context, h host.Host, log *slog.Logger) error {
	sub, err := h.EventBus().Subscribe([]any{
		new(event.EvtLocalReachabilityChanged),
		new(event.EvtNATDeviceTypeChanged),
		new(event.EvtAutoRelayAddrsUpdated),
	})
	if err != nil {
		return err
	}
	go func() {
		defer sub.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-sub.Out():
				if !ok {
					return
				}
				logReachability(log, e)
			}
		}
	}()
	return nil
}

func logReachability(log *slog.Logger, e any) {
	switch ev := e.(type) {
	case event.EvtLocalReachabilityChanged:
		switch ev.Reachability {
		case network.ReachabilityPublic:
			log.Info("reachability: public (peers can dial this node)")
		case network.ReachabilityPrivate:
			log.Info("reachability: private (peers cannot dial this node; it reserves a relay slot at its bootstrap peers and is reached through them or by hole punching)")
		default:
			log.Info("reachability: unknown")
		}
	case event.EvtNATDeviceTypeChanged:
		kind := "unknown"
		switch ev.NatDeviceType {
		case network.NATDeviceTypeEndpointIndependent:
			kind = "endpoint-independent (hole punching can connect peers behind NAT directly)"
		case network.NATDeviceTypeEndpointDependent:
			kind = "endpoint-dependent (symmetric: hole punching fails; peers behind NAT reach this node through a relay)"
		}
		log.Info("NAT in front of this node", "transport", ev.TransportProtocol.String(), "mapping", kind)
	case event.EvtAutoRelayAddrsUpdated:
		addrs := make([]string, 0, len(ev.RelayAddrs))
		for _, a := range ev.RelayAddrs {
			addrs = append(addrs, a.String())
		}
		if len(addrs) == 0 {
			log.Info("relay reservations: none (not reachable through a relay)")
			return
		}
		log.Info("relay reservations: reachable through relays", "addrs", strings.Join(addrs, " "))
	}
}
