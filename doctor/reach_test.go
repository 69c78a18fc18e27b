package doctor

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/autonat"
	"github.com/libp2p/go-libp2p/p2p/host/autonat/pb"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
)

func peerID(t *testing.T) peer.ID {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	require.NoError(t, err)
	id, err := peer.IDFromPrivateKey(k)
	require.NoError(t, err)
	return id
}

var (
	dialError   = autonat.Error{Status: pb.Message_E_DIAL_ERROR, Text: "dial failed"}
	dialRefused = autonat.Error{Status: pb.Message_E_DIAL_REFUSED, Text: "refusing to dial peer with blocked observed address"}
)

func TestReachability(t *testing.T) {
	validator, other, third, fourth := peerID(t), peerID(t), peerID(t), peerID(t)
	addr := func(p peer.ID) string { return "/ip4/203.0.113.7/tcp/4001/p2p/" + p.String() }
	for _, tc := range []struct {
		name      string
		bootstrap []string
		listen    []string
		psk       string
		answers   map[peer.ID]error
		want      Status
		says      string
		fix       string
		asked     []peer.ID
	}{
		{"no peer to ask", nil, nil, "", nil, OK, "skipped: no peer to ask", "", nil},
		{"bootstrap without a peer id", []string{"/ip4/203.0.113.7/tcp/4001"}, nil, "", nil, OK, "skipped: no peer to ask", "", nil},
		{"private network", []string{addr(validator)}, nil, "00", nil, OK, "skipped: node.psk is set", "", nil},
		{"reachable", []string{addr(other), addr(validator)}, nil, "", map[peer.ID]error{validator: nil}, OK,
			"reachable from outside: " + validator.String() + " dialed this machine back", "", []peer.ID{validator}},
		{"behind a NAT, fixed ports", []string{addr(validator)}, []string{"/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1"}, "",
			map[peer.ID]error{validator: dialError}, Warn, "not reachable from outside", "forward TCP port 4001 and UDP port 4001", []peer.ID{validator}},
		{"behind a NAT, any port", []string{addr(validator)}, []string{"/ip4/0.0.0.0/tcp/0"}, "",
			map[peer.ID]error{validator: dialError}, Warn, "relays and hole punching", "pin a port", []peer.ID{validator}},
		{"a refusal asks the next peer", []string{addr(validator), addr(other)}, nil, "",
			map[peer.ID]error{validator: dialRefused, other: nil}, OK, "reachable from outside", "", []peer.ID{validator, other}},
		{"nobody can tell", []string{addr(validator), addr(other), addr(third), addr(fourth)}, nil, "",
			map[peer.ID]error{validator: dialRefused, other: errors.New("connect: all dials failed\n  * [/ip4/203.0.113.7/tcp/4001] no route to host"), third: dialRefused}, Warn,
			"could not tell: " + validator.String() + " would not dial back", "", []peer.ID{validator, other, third}},
		{"errors on one line", []string{addr(other)}, nil, "", map[peer.ID]error{other: errors.New("connect: all dials failed\n  * [/ip4/203.0.113.7/tcp/4001] no route to host")}, Warn,
			"could not tell: " + other.String() + ": connect: all dials failed * [/ip4/203.0.113.7/tcp/4001] no route to host", "", []peer.ID{other}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Experiment.Validators = []string{validator.String()}
			cfg.Node.Bootstrap = tc.bootstrap
			cfg.Node.PSK = tc.psk
			if tc.listen != nil {
				cfg.Node.Listen = tc.listen
			}
			var asked []peer.ID
			m := Machine{DialBack: func(_ context.Context, _ *config.Config, p peer.AddrInfo) (string, error) {
				asked = append(asked, p.ID)
				return "node.listen's ports", tc.answers[p.ID]
			}}
			r := m.reachability(context.Background(), cfg)
			require.Equal(t, "reachable", r.Name)
			require.Equal(t, tc.want, r.Status, r.Detail)
			require.Contains(t, r.Detail, tc.says)
			if tc.fix == "" {
				require.Empty(t, r.Fix)
			} else {
				require.Contains(t, r.Fix, tc.fix)
			}
			require.Equal(t, tc.asked, asked)
		})
	}
}

// A real AutoNAT server on loopback is asked, and refuses: it sees this machine at a
// private address, from which reachability from outside cannot be told.
func TestDialBackAsksARealPeer(t *testing.T) {
	srv, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.EnableNATService())
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	cfg := config.Default()
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	ports, err := dialBack(context.Background(), cfg, peer.AddrInfo{ID: srv.ID(), Addrs: srv.Addrs()})
	require.True(t, autonat.IsDialRefused(err), "%v", err)
	require.Equal(t, "node.listen's ports", ports)

	// node.listen's port taken (the node runs): asked from other ports, and said so.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)}
	ports, err = dialBack(context.Background(), cfg, peer.AddrInfo{ID: srv.ID(), Addrs: srv.Addrs()})
	require.True(t, autonat.IsDialRefused(err), "%v", err)
	require.Equal(t, "other ports: node.listen's are taken", ports)

	// Nobody there: the question cannot be asked.
	gone := peer.AddrInfo{ID: srv.ID(), Addrs: srv.Addrs()}
	require.NoError(t, srv.Close())
	_, err = dialBack(context.Background(), cfg, gone)
	require.ErrorContains(t, err, "connect")
}

// TestBootstrapNeedsALibp2pAnswer: a bootstrap address counts as reached only when a libp2p
// node answers there, not when anything accepts the TCP connection (a proxy that intercepts
// every connection, another service on the port).
func TestBootstrapNeedsALibp2pAnswer(t *testing.T) {
	srv, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })

	// Something else: answers every connection with an HTTP error and closes it.
	other, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { other.Close() })
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	// Nobody: a port that was free a moment ago.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := free.Addr().String()
	require.NoError(t, free.Close())

	tcp := func(hostport string) string {
		host, port, err := net.SplitHostPort(hostport)
		require.NoError(t, err)
		return "/ip4/" + host + "/tcp/" + port
	}
	var libp2pAddr string
	for _, a := range srv.Addrs() {
		libp2pAddr = a.String() + "/p2p/" + srv.ID().String()
	}
	for _, tc := range []struct {
		name, addr, psk string
		want            Status
		detail          string
	}{
		{"a libp2p node", libp2pAddr, "", OK, "answers as a libp2p node (/noise)"},
		{"another service", tcp(other.Addr().String()), "", Warn, "accepts TCP connections but does not answer as a libp2p node"},
		{"another service under node.psk", tcp(other.Addr().String()), "/key/swarm/psk/1.0.0/\n/base16/\n" + strings.Repeat("ab", 32), OK, "TCP only"},
		{"nobody", tcp(nobody), "", Warn, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Node.Bootstrap = []string{tc.addr}
			cfg.Node.PSK = tc.psk
			rs := bootstrap(context.Background(), cfg)
			require.Len(t, rs, 1)
			require.Equal(t, tc.want, rs[0].Status, "%+v", rs[0])
			require.Contains(t, rs[0].Detail, tc.detail)
			if tc.want != OK {
				require.NotEmpty(t, rs[0].Fix)
			}
		})
	}
}
