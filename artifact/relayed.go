package artifact

import (
	"context"
	"errors"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	ma "github.com/multiformats/go-multiaddr"
)

// A holder behind NAT can be dialled by nobody: its updates reach the validators over the
// connections it opened to them. A validator behind NAT holds no such connection to a
// trainer behind another NAT, so it asks the holder through a relay where the holder
// keeps a reservation (p2p.NewHost: AutoRelay with the bootstrap peers as relays). The
// relay carries a transfer only where no direct path exists: a direct connection is
// used where there is one (the swarm prefers it to a relayed one, also once hole punching
// made one), and a dial tries the holder's direct TCP addresses first and its relay
// addresses only p2p.QUICAfterTCP later (the node's dial ranker). A relay bounds what one
// relayed connection carries (node.relay_limit, sized for an update).

// relayReason names the artifact protocol's use of limited (relayed) connections.
const relayReason = "artifact transfer from a holder without a direct path"

// relayAddrTTL is how long the circuit addresses of a holder stay in the peerstore: long
// enough for the rest of a round's transfers from it.
const relayAddrTTL = 10 * time.Minute

// newStream opens an artifact stream to p: on a direct connection, dialled if need be;
// else, with relays configured, through one of them.
func (x *Exchange) newStream(ctx context.Context, p peer.ID) (network.Stream, error) {
	if x.h.Network().Connectedness(p) == network.Connected {
		return x.h.NewStream(ctx, p, ProtocolID)
	}
	addrs := x.circuitAddrs(p)
	if len(addrs) == 0 {
		return x.h.NewStream(ctx, p, ProtocolID)
	}
	x.h.Peerstore().AddAddrs(p, addrs, relayAddrTTL)
	relayed := network.WithAllowLimitedConn(ctx, relayReason)
	s, err := x.h.NewStream(relayed, p, ProtocolID)
	if err != nil && errors.Is(err, swarm.ErrDialBackoff) && ctx.Err() == nil {
		// A relayed dial can fail for a reason that passes at once: go-libp2p's circuit
		// client folds two dials to one peer through one relay into one and fails the
		// second ("concurrent active dial succeeded"). The swarm then backs the circuit
		// address off, and every fetch from that holder failed on "dial backoff" for the
		// rest of the pass (the lab: a leader behind NAT handed a round on). A relay
		// answers a dial for a peer without a reservation at once: dial again.
		if sw, ok := x.h.Network().(interface{ Backoff() *swarm.DialBackoff }); ok {
			sw.Backoff().Clear(p)
			s, err = x.h.NewStream(relayed, p, ProtocolID)
		}
	}
	if err == nil && s.Conn().Stat().Limited {
		x.log.Debug("artifact stream through a relay: no direct connection to the holder", "peer", p.String(),
			"remote", s.Conn().RemoteMultiaddr().String())
	}
	return s, err
}

// circuitAddrs are p's addresses through each relay (other than p and this node).
func (x *Exchange) circuitAddrs(p peer.ID) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, r := range x.opts.Relays {
		if r.ID == p || r.ID == x.h.ID() {
			continue
		}
		circuit, err := ma.NewMultiaddr("/p2p/" + r.ID.String() + "/p2p-circuit")
		if err != nil {
			continue
		}
		for _, a := range r.Addrs {
			out = append(out, a.Encapsulate(circuit))
		}
	}
	return out
}
