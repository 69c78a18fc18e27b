package p2p

import (
	"context"
	"errors"
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
	ma "github.com/multiformats/go-multiaddr"

	"github.com/p2pnode/p2pnode/config"
)

// BootstrapPeers parses node.bootstrap (validated already).
func BootstrapPeers(cfg *config.Config) ([]peer.AddrInfo, error) {
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

// KeptPeers are the peers a node keeps connected: the bootstrap peers (with their
// configured addresses) and the validators other than itself (dialled at the addresses
// the peerstore has learnt for them).
func KeptPeers(cfg *config.Config, validators []peer.ID, self peer.ID) ([]peer.AddrInfo, error) {
	peers, err := BootstrapPeers(cfg)
	if err != nil {
		return nil, err
	}
	for _, id := range validators {
		if id != self && !slices.ContainsFunc(peers, func(ai peer.AddrInfo) bool { return ai.ID == id }) {
			peers = append(peers, peer.AddrInfo{ID: id})
		}
	}
	return peers, nil
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
	// keepWarnAfter is how long a kept peer may stay unreachable before the node warns,
	// naming it and the addresses it dials: a mistyped or dead bootstrap address is
	// otherwise silent (dial failures are debug lines, retried forever).
	keepWarnAfter = 5 * time.Second
	// A link that drops everything without a word (a cable pulled, a home router's uplink
	// gone) leaves the connection open at both ends, and yamux's keepalive gives up on it
	// only after 30 s of waiting and a 10-s timeout: a trainer cut off for 30 s in the WAN
	// lab connected again 41–43 s after the cut began, 11–13 s after the link was back,
	// and missed a round for it (docs/wan.md, faults). So every connection to a kept peer
	// is pinged over itself every keepProbeEvery, and one that does not answer within
	// keepProbeTimeout (yamux's own write timeout) is closed, and the peer dialled again.
	keepProbeEvery   = 5 * time.Second
	keepProbeTimeout = 10 * time.Second
)

// keptPeer is the redial state of one kept peer.
type keptPeer struct {
	ai      peer.AddrInfo
	backoff time.Duration
	next    time.Time
	dialing bool
	// down is when the peer was last seen unconnected after being connected (or keep
	// started); warned whether this outage was reported; lastErr the last dial's error.
	down    time.Time
	warned  bool
	lastErr error
	// probing: its connections are being pinged; probed when that last began.
	probing bool
	probed  time.Time
}

// KeptWatch keeps a node connected to its kept peers (Keep), and remembers the addresses
// it reached them at. A validator is configured by peer id only; its addresses are what
// the peerstore learnt while connected to it, and the peerstore can lose them when the
// connection drops (docs/design-notes.md, "Kept peers"). So every outbound connection's
// remote address, and the addresses the peerstore holds while connected, are kept here
// as well.
type KeptWatch struct {
	h      host.Host
	peers  []peer.AddrInfo
	notify *network.NotifyBundle
	// The redial and liveness timings (keepDialTimeout, keepProbeEvery,
	// keepProbeTimeout; tests shorten them).
	dialTimeout, probeEvery, probeTimeout time.Duration

	mu sync.Mutex
	// dialled holds the remote addresses of outbound connections to each kept peer,
	// advertised those the peerstore held for it while connected; newest last, at most
	// maxKeptAddrs each, so a peer that advertises many cannot push out the one that
	// worked.
	dialled, advertised map[peer.ID][]ma.Multiaddr
}

// maxKeptAddrs bounds each list of addresses remembered per kept peer.
const maxKeptAddrs = 8

// WatchKept starts remembering the kept peers' addresses: from the connections open now
// and from every connection opened until close.
func WatchKept(h host.Host, peers []peer.AddrInfo) *KeptWatch {
	w := &KeptWatch{h: h, dialled: map[peer.ID][]ma.Multiaddr{}, advertised: map[peer.ID][]ma.Multiaddr{},
		dialTimeout: keepDialTimeout, probeEvery: keepProbeEvery, probeTimeout: keepProbeTimeout}
	kept := map[peer.ID]bool{}
	for _, ai := range peers {
		if ai.ID != h.ID() {
			w.peers = append(w.peers, ai)
			kept[ai.ID] = true
		}
	}
	// An inbound connection's remote address is the peer's outgoing port, not one it
	// listens at: only dialled connections teach an address here.
	w.notify = &network.NotifyBundle{ConnectedF: func(_ network.Network, c network.Conn) {
		if kept[c.RemotePeer()] && c.Stat().Direction == network.DirOutbound {
			w.learn(w.dialled, c.RemotePeer(), c.RemoteMultiaddr())
		}
	}}
	h.Network().Notify(w.notify)
	for id := range kept {
		for _, c := range h.Network().ConnsToPeer(id) {
			w.notify.Connected(h.Network(), c)
		}
	}
	return w
}

// Close stops remembering addresses.
func (w *KeptWatch) Close() { w.h.Network().StopNotify(w.notify) }

// learn adds addrs to p's list in m (dialled or advertised).
func (w *KeptWatch) learn(m map[peer.ID][]ma.Multiaddr, p peer.ID, addrs ...ma.Multiaddr) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := m[p]
	for _, a := range addrs {
		l = slices.DeleteFunc(l, a.Equal)
		l = append(l, a)
	}
	if len(l) > maxKeptAddrs {
		l = slices.Clone(l[len(l)-maxKeptAddrs:])
	}
	m[p] = l
}

// addrs is what keep dials a kept peer at: its configured addresses and those remembered
// (the peerstore's are added by the dial itself).
func (w *KeptWatch) addrs(ai peer.AddrInfo) []ma.Multiaddr {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Concat(ai.Addrs, w.dialled[ai.ID], w.advertised[ai.ID])
}

// keepConnected watches and keeps the kept peers connected until ctx ends (WatchKept and
// Keep in one, for callers with nothing to dial before).
func keepConnected(ctx context.Context, h host.Host, peers []peer.AddrInfo, log *slog.Logger) {
	w := WatchKept(h, peers)
	defer w.Close()
	w.Keep(ctx, log)
}

// Keep dials the kept peers at start and again whenever a connection drops, each in its
// own goroutine so that a peer whose dials hang does not delay the others.
func (w *KeptWatch) Keep(ctx context.Context, log *slog.Logger) {
	h := w.h
	state := make(map[peer.ID]*keptPeer, len(w.peers))
	for _, ai := range w.peers {
		state[ai.ID] = &keptPeer{ai: ai, down: time.Now()}
	}
	type result struct {
		id  peer.ID
		err error
	}
	results, probed := make(chan result), make(chan peer.ID)
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(keepTick)
	defer t.Stop()
	for {
		now := time.Now()
		for id, k := range state {
			if h.Network().Connectedness(id) == network.Connected {
				// What identify learnt: the addresses the peer listens at.
				w.learn(w.advertised, id, h.Peerstore().Addrs(id)...)
				k.down, k.warned = time.Time{}, false
				if !k.probing && now.Sub(k.probed) >= w.probeEvery {
					k.probing, k.probed = true, now
					wg.Go(func() {
						w.probe(ctx, id, log)
						select {
						case probed <- id:
						case <-ctx.Done():
						}
					})
				}
				continue
			}
			if k.down.IsZero() {
				k.down = now
			}
			if !k.warned && len(k.ai.Addrs) > 0 && now.Sub(k.down) >= keepWarnAfter {
				k.warned = true
				log.Warn("cannot reach a bootstrap peer; check node.bootstrap and that the peer runs",
					"peer", id.String(), "addrs", fmt.Sprint(k.ai.Addrs), "for", now.Sub(k.down).Round(time.Second).String(), "err", k.lastErr)
			}
			if k.dialing || now.Before(k.next) {
				continue
			}
			ai := peer.AddrInfo{ID: id, Addrs: w.addrs(k.ai)}
			if len(ai.Addrs) == 0 && len(h.Peerstore().Addrs(id)) == 0 {
				continue // a validator we have not learnt an address for yet
			}
			k.dialing = true
			wg.Go(func() {
				err := dialKept(ctx, h, ai, w.dialTimeout, log)
				select {
				case results <- result{id, err}:
				case <-ctx.Done():
				}
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case id := <-probed:
			state[id].probing = false
		case r := <-results:
			id := r.id
			k := state[id]
			k.dialing, k.lastErr = false, r.err
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
// dial for seconds after the peer is back. It dials directly only: a relayed connection
// (the peerstore may hold a relay address of the peer) is limited, not Connected, and
// Keep would dial it again on every tick.
func dialKept(ctx context.Context, h host.Host, ai peer.AddrInfo, timeout time.Duration, log *slog.Logger) error {
	if sw, ok := h.Network().(interface{ Backoff() *swarm.DialBackoff }); ok {
		sw.Backoff().Clear(ai.ID)
	}
	dctx, cancel := context.WithTimeout(network.WithForceDirectDial(ctx, "kept peer"), timeout)
	defer cancel()
	if err := h.Connect(dctx, ai); err != nil {
		log.Debug("dial of a bootstrap peer or validator failed", "peer", ai.ID.String(), "err", err)
		return err
	}
	log.Info("connected to a bootstrap peer or validator", "peer", ai.ID.String())
	return nil
}

// probe pings each direct connection to the kept peer id over itself, side by side, and
// closes those that do not answer within probeTimeout (see keepProbeEvery): Keep then
// dials the peer again. Relayed connections are left to the relay's limits.
func (w *KeptWatch) probe(ctx context.Context, id peer.ID, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, w.probeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range w.h.Network().ConnsToPeer(id) {
		if c.Stat().Limited {
			continue
		}
		wg.Go(func() {
			// Only silence counts: a refusal (a peer without the ping protocol) is an answer.
			err := pingOver(ctx, c)
			if err == nil || c.IsClosed() || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return
			}
			log.Warn("a bootstrap peer or validator stopped answering over its connection; closing it and dialling again",
				"peer", id.String(), "remote", c.RemoteMultiaddr().String(), "err", err)
			_ = c.Close()
		})
	}
	wg.Wait()
}

// Rendezvous is the DHT namespace the nodes of cfg's experiment meet under.
func Rendezvous(cfg *config.Config) string {
	return "/p2ptrain/" + cfg.Experiment.Network + "/" + cfg.Experiment.ID
}

// NewDHT is the Kademlia DHT of cfg's network on h (protocol prefix /p2ptrain/<network>),
// in auto server mode, bootstrapping from peers; it runs until ctx ends.
func NewDHT(ctx context.Context, h host.Host, cfg *config.Config, peers []peer.AddrInfo) (*dht.IpfsDHT, error) {
	d, err := dht.New(ctx, h, dht.Mode(dht.ModeAutoServer), dht.ProtocolPrefix(protocol.ID("/p2ptrain/"+cfg.Experiment.Network)),
		dht.BootstrapPeers(peers...))
	if err != nil {
		return nil, fmt.Errorf("node.dht: %w", err)
	}
	return d, nil
}

// RendezvousLoop advertises this node under the experiment's namespace and connects to the
// other nodes found there, so a swarm grows beyond its bootstrap peers.
func RendezvousLoop(ctx context.Context, h host.Host, d *dht.IpfsDHT, ns string, log *slog.Logger) {
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

// MDNS finds the peers of the experiment's network on the LAN and connects to them,
// between Start and Close.
type MDNS struct {
	svc    mdns.Service
	cancel context.CancelFunc
	n      *mdnsNotifee
}

// NewMDNS is the mDNS discovery of cfg's network on h.
func NewMDNS(h host.Host, cfg *config.Config, log *slog.Logger) *MDNS {
	ctx, cancel := context.WithCancel(context.Background())
	n := &mdnsNotifee{ctx: ctx, h: h, log: log}
	return &MDNS{svc: mdns.NewMdnsService(h, "p2ptrain-"+cfg.Experiment.Network, n), cancel: cancel, n: n}
}

// Start starts answering and querying on the LAN.
func (m *MDNS) Start() error { return m.svc.Start() }

// Close stops the service, cancels the connections it started and waits for them.
func (m *MDNS) Close() error {
	err := m.svc.Close()
	m.cancel()
	m.n.wg.Wait()
	return err
}

type mdnsNotifee struct {
	ctx context.Context // ends with the MDNS
	wg  sync.WaitGroup  // the connections started
	h   host.Host
	log *slog.Logger
}

// HandlePeerFound connects to peers found on the LAN.
func (n *mdnsNotifee) HandlePeerFound(ai peer.AddrInfo) {
	if ai.ID == n.h.ID() || n.ctx.Err() != nil {
		return
	}
	n.wg.Go(func() {
		ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
		defer cancel()
		if err := n.h.Connect(ctx, ai); err == nil {
			n.log.Info("connected to a peer on the LAN", "peer", ai.ID.String())
		}
	})
}
