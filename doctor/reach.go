package doctor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/autonat"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/p2pnode/p2pnode/config"
)

// ReachTimeout bounds the reachability check: connecting to a peer and its dial back.
const ReachTimeout = 30 * time.Second

// maxAsked is how many peers the reachability check asks before it gives up.
const maxAsked = 3

// DialBack is one AutoNAT question: from a short-lived host listening as the config says,
// ask p to dial this machine back. It returns nil when p could, autonat's dial error when
// it could not, its refusal when it would not try, and other errors when p could not be
// asked. ports says what the host listened on.
type DialBack func(ctx context.Context, cfg *config.Config, p peer.AddrInfo) (ports string, err error)

// peersToAsk are the peers of node.bootstrap (validators first) that the reachability
// check may ask: those with an address and a peer id.
func peersToAsk(cfg *config.Config) []peer.AddrInfo {
	var vals, others []peer.AddrInfo
	seen := map[peer.ID]bool{}
	for _, b := range cfg.Node.Bootstrap {
		a, err := ma.NewMultiaddr(b)
		if err != nil {
			continue
		}
		info, err := peer.AddrInfoFromP2pAddr(a)
		if err != nil || len(info.Addrs) == 0 || seen[info.ID] {
			continue
		}
		seen[info.ID] = true
		if slices.Contains(cfg.Experiment.Validators, info.ID.String()) {
			vals = append(vals, *info)
		} else {
			others = append(others, *info)
		}
	}
	return append(vals, others...)
}

// reachability asks peers of the config whether this machine can be dialed from outside
// (AutoNAT): a node that cannot still works, through relays and hole punching, but
// slower and only as long as a peer relays for it.
func (m Machine) reachability(ctx context.Context, cfg *config.Config) Result {
	const name = "reachable"
	if cfg.Node.PSK != "" {
		return Result{Name: name, Status: OK, Detail: "skipped: node.psk is set (a private network, whose peers do not answer AutoNAT questions from outside it)"}
	}
	peers := peersToAsk(cfg)
	if len(peers) == 0 {
		return Result{Name: name, Status: OK, Detail: "skipped: no peer to ask (node.bootstrap names none with an address and /p2p/ id)"}
	}
	dial := m.DialBack
	if dial == nil {
		dial = dialBack
	}
	var failures []string
	for _, p := range peers[:min(len(peers), maxAsked)] {
		ports, err := dial(ctx, cfg, p)
		switch {
		case err == nil:
			return Result{Name: name, Status: OK, Detail: fmt.Sprintf("reachable from outside: %s dialed this machine back (%s)", p.ID, ports)}
		case autonat.IsDialError(err):
			return Result{Name: name, Status: Warn,
				Detail: fmt.Sprintf("not reachable from outside: %s could not dial this machine back (%s); it is behind a NAT or a firewall, so peers reach it through relays and hole punching, which is slower and works only while a peer relays for it", p.ID, ports),
				Fix:    reachFix(cfg)}
		case autonat.IsDialRefused(err):
			failures = append(failures, fmt.Sprintf("%s would not dial back (it sees this machine at a private address, as on the same network, or it is busy)", p.ID))
		default:
			// One line: libp2p lists each address's dial error on a line of its own.
			failures = append(failures, fmt.Sprintf("%s: %s", p.ID, strings.Join(strings.Fields(err.Error()), " ")))
		}
	}
	return Result{Name: name, Status: Warn, Detail: "could not tell: " + strings.Join(failures, "; ")}
}

// reachFix says how to make the machine reachable: a fixed port, forwarded or opened.
func reachFix(cfg *config.Config) string {
	var fixed []string
	for _, l := range cfg.Node.Listen {
		a, err := ma.NewMultiaddr(l)
		if err != nil {
			continue
		}
		network, hostport, err := manet.DialArgs(a)
		if err != nil {
			continue
		}
		_, port, err := net.SplitHostPort(hostport)
		if err != nil || port == "0" {
			continue
		}
		fixed = append(fixed, strings.ToUpper(strings.TrimRight(network, "46"))+" port "+port)
	}
	if len(fixed) == 0 {
		return "pin a port (--listen /ip4/0.0.0.0/tcp/4001 --listen /ip4/0.0.0.0/udp/4001/quic-v1), then forward it on the router to this machine or open it in the firewall; nothing else is needed to train"
	}
	return "forward " + strings.Join(fixed, " and ") + " on the router to this machine, or open them in its firewall; nothing else is needed to train"
}

// dialBack is DialBack over the network: a host with a fresh key (nothing of this
// machine's node is used or written), listening on node.listen's ports, or on any ports
// when they are taken, for as long as the question takes.
func dialBack(ctx context.Context, cfg *config.Config, p peer.AddrInfo) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, ReachTimeout)
	defer cancel()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return "", err
	}
	ports := "node.listen's ports"
	h, err := probeHost(key, cfg.Node.Listen)
	if err != nil {
		ports = "other ports: node.listen's are taken"
		if h, err = probeHost(key, []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"}); err != nil {
			return ports, fmt.Errorf("start a host to ask from: %w", err)
		}
	}
	defer h.Close()
	if err := h.Connect(ctx, p); err != nil {
		return ports, fmt.Errorf("connect: %w", err)
	}
	err = autonat.NewAutoNATClient(h, nil, nil).DialBack(ctx, p.ID)
	var ae autonat.Error
	if err != nil && !errors.As(err, &ae) {
		return ports, fmt.Errorf("ask: %w", err)
	}
	return ports, err
}

// probeHost is a host that listens on listen and does nothing else: no relay, no port
// mapping on the router, no AutoNAT of its own.
func probeHost(key crypto.PrivKey, listen []string) (host.Host, error) {
	return libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings(listen...), libp2p.DisableRelay(),
		libp2p.UserAgent("p2pnode-doctor"))
}
