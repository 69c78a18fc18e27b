package p2p

import (
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/internal/version"
)

// Streams one peer may hold open on each of our protocols. A fetcher opens
// artifact.DefaultStreamsPerPeer streams per download and runs a few downloads at once;
// to a holder far away a download opens more, its downloads together at most 12
// (artifact/streams.go). Head sync is one short request per stream.
const (
	artifactStreamsPerPeer = 16
	syncStreamsPerPeer     = 4
)

// resourceLimits are libp2p's default limits with ours per peer for each /p2ptrain/*
// protocol and its service, so that one peer cannot hold more than a few streams of a
// protocol however it opens them.
func resourceLimits() rcmgr.ScalingLimitConfig {
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	perPeer := func(proto protocol.ID, svc string, inbound int, memory int64) {
		l := rcmgr.BaseLimit{StreamsInbound: inbound, StreamsOutbound: 4 * inbound, Streams: 5 * inbound, Memory: memory}
		limits.AddProtocolPeerLimit(proto, l, rcmgr.BaseLimitIncrease{})
		limits.AddServicePeerLimit(svc, l, rcmgr.BaseLimitIncrease{})
	}
	perPeer(artifact.ProtocolID, artifact.ServiceName, artifactStreamsPerPeer, 64<<20)
	perPeer(chain.SyncProtocol, chain.SyncServiceName, syncStreamsPerPeer, 64<<20)
	return limits
}

// NewHost is the node's libp2p host: TCP and QUIC, Noise, yamux, identify, ping,
// AutoNAT service, circuit relay v2 client (and server on bootstrap nodes), hole punching,
// the resource manager with scaled default limits, a connection manager and, when
// node.psk is set, a private network.
func NewHost(cfg *config.Config, key crypto.PrivKey, bw metrics.Reporter, reg prometheus.Registerer, log *slog.Logger) (host.Host, error) {
	limits := resourceLimits()
	return newHostWithLimits(cfg, key, bw, reg, log, limits.AutoScale())
}

// newHostWithLimits is NewHost with the resource manager's limits given (scaled to this
// machine in NewHost, fixed in tests); the connection manager's watermarks follow them.
func newHostWithLimits(cfg *config.Config, key crypto.PrivKey, bw metrics.Reporter, reg prometheus.Registerer, log *slog.Logger,
	concrete rcmgr.ConcreteLimitConfig) (host.Host, error) {
	labAddressesFromEnv()
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(concrete))
	if err != nil {
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	low, high := connWatermarks(concrete)
	cm, err := connmgr.NewConnManager(low, high, connmgr.WithGracePeriod(connGrace), connmgr.WithSilencePeriod(connSilence))
	if err != nil {
		return nil, fmt.Errorf("connection manager: %w", err)
	}
	listen := cfg.Node.Listen
	dialer := newTCPDialer()
	opts := []libp2p.Option{
		libp2p.Identity(key),
		libp2p.Transport(tcp.NewTCPTransport, dialer.option()),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, Yamux(YamuxMaxMessageSize)),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(cm),
		libp2p.EnableNATService(),
		libp2p.EnableHolePunching(),
		libp2p.EnableRelay(),
		libp2p.BandwidthReporter(bw),
		libp2p.PrometheusRegisterer(reg),
		libp2p.UserAgent(version.Agent()),
		libp2p.Ping(true),
		// TCP before QUIC: on a lossy link QUIC moves updates at a fraction of TCP's rate.
		libp2p.SwarmOpts(swarm.WithDialRanker(TCPFirst)),
	}
	if cfg.Node.PSK != "" {
		psk, err := parsePSK(cfg.Node.PSK)
		if err != nil {
			return nil, err
		}
		// QUIC has its own handshake and cannot run inside a private network.
		var tcpOnly []string
		for _, a := range listen {
			if !strings.Contains(a, "/quic") {
				tcpOnly = append(tcpOnly, a)
			}
		}
		if len(tcpOnly) == 0 {
			return nil, fmt.Errorf("node.psk: a private network runs over TCP only, but node.listen has no TCP address")
		}
		if len(tcpOnly) < len(listen) {
			log.Warn("node.psk is set: not listening on QUIC (private networks are TCP only)")
		}
		listen = tcpOnly
		opts = append(opts, libp2p.PrivateNetwork(psk))
	} else {
		opts = append(opts, libp2p.Transport(libp2pquic.NewTransport))
	}
	if cfg.Node.Relay || cfg.Experiment.HasRole(config.RoleBootstrap) {
		rl := cfg.Node.RelayLimit
		opts = append(opts, libp2p.EnableRelayService(relay.WithLimit(&relay.RelayLimit{Duration: rl.Duration, Data: rl.DataMiB << 20})))
	}
	self, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("node.identity: %w", err)
	}
	reach, err := reachabilityOptions(cfg, self)
	if err != nil {
		return nil, err
	}
	opts = append(opts, reach...)
	opts = append(opts, libp2p.ListenAddrStrings(listen...))
	h, err := libp2p.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("node.listen: start libp2p host: %w", err)
	}
	if err := checkListening(cfg.Node.Listen, listen, h); err != nil {
		h.Close()
		return nil, err
	}
	dialer.attach(h)
	return h, nil
}

// relayBackoff is how long AutoRelay waits before asking a relay again that refused a
// reservation or could not be reached (libp2p's default is an hour: a volunteer whose
// bootstrap node restarted would stay unreachable through it that long).
const relayBackoff = time.Minute

// reachabilityOptions are the options of node.reachability, and AutoRelay with the
// bootstrap peers as the relays: a node that is (or AutoNAT finds it) private reserves a
// slot at them, so that a peer that cannot dial it — a validator behind another NAT
// fetching its update — reaches it through a relay (artifact.ExchangeOptions.Relays).
// AutoRelay does nothing while the node is public or its reachability unknown.
func reachabilityOptions(cfg *config.Config, self peer.ID) ([]libp2p.Option, error) {
	var opts []libp2p.Option
	switch cfg.Node.Reachability {
	case config.ReachPublic:
		opts = append(opts, libp2p.ForceReachabilityPublic())
	case config.ReachPrivate:
		opts = append(opts, libp2p.ForceReachabilityPrivate())
	}
	relays, err := BootstrapPeers(cfg)
	if err != nil {
		return nil, err
	}
	relays = slices.DeleteFunc(relays, func(ai peer.AddrInfo) bool { return ai.ID == self })
	if len(relays) > 0 {
		// One candidate is enough: static relays otherwise wait for every one of them to
		// answer (or for a 3-minute boot delay), and a bootstrap list may name peers that
		// relay nothing (a validator behind NAT).
		opts = append(opts, libp2p.EnableAutoRelayWithStaticRelays(relays,
			autorelay.WithMinCandidates(1), autorelay.WithBackoff(relayBackoff)))
	}
	return opts, nil
}

var portRe = regexp.MustCompile(`/(tcp|udp)/(\d+)`)

// checkListening fails when an address of node.listen got no listener: libp2p starts as
// long as one address works, so a TCP port in use would otherwise leave a node silently
// reachable over QUIC alone. A port of 0 matches any port.
func checkListening(configured, used []string, h host.Host) error {
	var have []string
	for _, a := range h.Network().ListenAddresses() {
		have = append(have, a.String())
	}
	for _, want := range used {
		wildPort := strings.Contains(want, "/tcp/0") || strings.Contains(want, "/udp/0")
		norm := func(s string) string {
			if wildPort {
				return portRe.ReplaceAllString(s, "/$1/0")
			}
			return s
		}
		found := false
		for _, a := range have {
			if strings.HasPrefix(norm(a), norm(want)) { // webtransport appends certhashes
				found = true
				break
			}
		}
		if found {
			continue
		}
		field := "node.listen"
		if i := slices.Index(configured, want); i >= 0 {
			field = fmt.Sprintf("node.listen[%d]", i)
		}
		return fmt.Errorf("%s: could not listen on %s: %s", field, want, listenFailure(want))
	}
	return nil
}

var tcpAddrRe = regexp.MustCompile(`^/ip[46]/([^/]+)/tcp/(\d+)$`)

// listenFailure says why a listen address failed, as far as the OS tells.
func listenFailure(addr string) string {
	m := tcpAddrRe.FindStringSubmatch(addr)
	if m == nil {
		return "the transport refused it"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(m[1], m[2]))
	if err == nil {
		ln.Close()
		return "the transport refused it"
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Sprintf("port %s is already in use (another p2pnode with this config?); set another port, or 0 for a free one", m[2])
	}
	return err.Error()
}

// parsePSK reads node.psk: 64 hex characters (32 bytes).
func parsePSK(s string) (pnet.PSK, error) {
	b, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != 32 {
		return nil, fmt.Errorf("node.psk: must be 64 hex characters (32 bytes)")
	}
	return pnet.PSK(b), nil
}

// HostAddrs are the host's addresses with its peer id, for status and for others to dial.
func HostAddrs(h host.Host) []string {
	out := make([]string, 0, len(h.Addrs()))
	for _, a := range h.Addrs() {
		out = append(out, a.Encapsulate(ma.StringCast("/p2p/"+h.ID().String())).String())
	}
	return out
}

// YamuxMaxMessageSize is the largest yamux frame the node sends. yamux's default, 64 KiB,
// is 17 bytes more than one Noise message carries (65 535 bytes with its 16-byte tag), so
// every full frame costs two Noise messages; 65 519 puts each frame in one.
const YamuxMaxMessageSize = 65519

// Yamux is libp2p's yamux transport with frames of at most maxMessage bytes (0 keeps the
// default). The WAN goodput test measures both sizes on a rate-limited link.
func Yamux(maxMessage uint32) *yamux.Transport {
	t := *yamux.DefaultTransport
	if maxMessage > 0 {
		t.MaxMessageSize = maxMessage
	}
	return &t
}
