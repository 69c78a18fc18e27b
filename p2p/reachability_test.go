package p2p

import (
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/event"
	"github.com/libp2p/go-libp2p/core/network"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/stretchr/testify/require"
)

// What libp2p finds out about reaching the node is logged as it comes: a volunteer reads
// there whether AutoNAT found it private, what its NAT does to hole punching, and whether
// it holds a relay slot.
func TestWatchReachabilityLogsWhatLibp2pFindsOut(t *testing.T) {
	relayed := ma.StringCast("/ip4/198.18.0.1/tcp/4001/p2p/12D3KooWLRPJAA5o6m7pVHE4XLVt4dmMy5a9cuJjXgwKF8ZsNtko/p2p-circuit")
	tests := []struct {
		name  string
		event any
		want  string
	}{
		{"private", event.EvtLocalReachabilityChanged{Reachability: network.ReachabilityPrivate}, "reachability: private"},
		{"public", event.EvtLocalReachabilityChanged{Reachability: network.ReachabilityPublic}, "reachability: public"},
		{"symmetric NAT", event.EvtNATDeviceTypeChanged{TransportProtocol: network.NATTransportTCP, NatDeviceType: network.NATDeviceTypeEndpointDependent},
			`transport=TCP mapping="endpoint-dependent (symmetric: hole punching fails`},
		{"cone NAT", event.EvtNATDeviceTypeChanged{TransportProtocol: network.NATTransportUDP, NatDeviceType: network.NATDeviceTypeEndpointIndependent},
			`transport=UDP mapping="endpoint-independent`},
		{"a reservation", event.EvtAutoRelayAddrsUpdated{RelayAddrs: []ma.Multiaddr{relayed}}, `relay reservations: reachable through relays" addrs=` + relayed.String()},
		{"no reservation", event.EvtAutoRelayAddrsUpdated{}, "relay reservations: none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out lockedLog
			defer func() {
				if t.Failed() {
					t.Logf("log: %s", out.String())
				}
			}()
			mn := mocknet.New()
			t.Cleanup(func() { mn.Close() })
			h, err := mn.GenPeer()
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			require.NoError(t, WatchReachability(ctx, h, slog.New(slog.NewTextHandler(&out, nil))))
			em, err := h.EventBus().Emitter(reflect.New(reflect.TypeOf(tt.event)).Interface())
			require.NoError(t, err)
			defer em.Close()
			require.NoError(t, em.Emit(tt.event))
			require.Eventually(t, func() bool { return strings.Contains(out.String(), tt.want) }, 5*time.Second, 10*time.Millisecond)
		})
	}
}
