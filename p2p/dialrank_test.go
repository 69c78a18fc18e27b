package p2p

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/stretchr/testify/require"
)

func TestTCPFirst(t *testing.T) {
	const relayed = "/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWQa9iq8rhTSvn3sP8ZMsu3Rjy8jZyWXtj8dJNoCUSkYgd/p2p-circuit"
	addrs := func(ss ...string) []ma.Multiaddr {
		var out []ma.Multiaddr
		for _, s := range ss {
			out = append(out, ma.StringCast(s))
		}
		return out
	}
	type dial struct {
		addr  string
		delay time.Duration
	}
	cases := []struct {
		name  string
		addrs []ma.Multiaddr
		want  []dial
	}{
		{"public: TCP at once, QUIC after it", addrs("/ip4/1.2.3.4/udp/4001/quic-v1", "/ip4/1.2.3.4/tcp/4001"),
			[]dial{{"/ip4/1.2.3.4/tcp/4001", 0}, {"/ip4/1.2.3.4/udp/4001/quic-v1", QUICAfterTCP}}},
		{"two TCP addresses keep the default's spacing, QUIC after the last", addrs("/ip4/1.2.3.4/tcp/4001", "/ip4/1.2.3.4/tcp/4002", "/ip4/1.2.3.4/udp/4001/quic-v1"),
			[]dial{{"/ip4/1.2.3.4/tcp/4001", 0}, {"/ip4/1.2.3.4/tcp/4002", swarm.PublicTCPDelay}, {"/ip4/1.2.3.4/udp/4001/quic-v1", swarm.PublicTCPDelay + QUICAfterTCP}}},
		{"QUIC only: the default", addrs("/ip4/1.2.3.4/udp/4001/quic-v1"),
			[]dial{{"/ip4/1.2.3.4/udp/4001/quic-v1", 0}}},
		{"a relayed TCP address is not direct TCP", addrs(relayed, "/ip4/5.6.7.8/tcp/4001"),
			[]dial{{"/ip4/5.6.7.8/tcp/4001", 0}, {relayed, QUICAfterTCP}}},
		{"private addresses: TCP first too", addrs("/ip4/192.168.1.2/udp/4001/quic-v1", "/ip4/192.168.1.2/tcp/4001"),
			[]dial{{"/ip4/192.168.1.2/tcp/4001", 0}, {"/ip4/192.168.1.2/udp/4001/quic-v1", QUICAfterTCP}}},
		{"nothing to dial", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []dial
			for _, ad := range TCPFirst(tc.addrs) {
				got = append(got, dial{ad.Addr.String(), ad.Delay})
			}
			require.Equal(t, tc.want, got)
		})
	}
	// Every address given is dialled once, whatever its kind.
	all := addrs("/ip4/1.2.3.4/udp/4001/quic-v1", "/ip4/1.2.3.4/tcp/4001", relayed, "/ip6/::1/tcp/4001", "/ip4/1.2.3.4/udp/4001/webrtc-direct")
	require.Len(t, TCPFirst(all), len(all))
	var _ network.DialRanker = TCPFirst
}
