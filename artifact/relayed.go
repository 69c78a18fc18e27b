package artifact

import (
	"context"
	"errors"
	"strings"
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
//
// Only an artifact's origins (its trainer, a head's proposer and signers: hints and
// AddHolder) are asked through a relay. A copy holder (AddCopy: a peer announcing the
// head's artifacts it keeps) is an extra source: through the relay its bytes would cross
// the relay's uplink, which the origins' own holders — the validators — can send
// directly. A relayed connection to it only carries DCUtR's hole punch, and its chunks
// come over the direct connection that makes, where its router allows one.

// relayReason names the artifact protocol's use of limited (relayed) connections.
const relayReason = "artifact transfer from a holder without a direct path"

// relayAddrTTL is how long the circuit addresses of a holder stay in the peerstore: long
// enough for the rest of a round's transfers from it.
const relayAddrTTL = 10 * time.Minute

// holePunchWait bounds how long a stream to a copy holder waits for a hole punch to give
// a direct connection: the lab's punches between cone routers took 1 s at 80 ms and 5.5 s
// at 500 ms between the homes (docs/wan.md), and a failed one takes libp2p's three
// attempts, about 20 s, which a download whose other holders lack the artifact would
// otherwise wait out.
const holePunchWait = 10 * time.Second

// newStream opens an artifact stream to p: on a direct connection, dialled if need be;
// else, with relays configured, through one of them — unless direct is set (a copy
// holder, Exchange.AddCopy): then a relayed connection only carries the hole punch, and
// the stream waits for the direct connection it makes (go-libp2p's swarm does the
// waiting, up to ctx's deadline; the holder, on the inbound relayed connection, starts
// DCUtR). A copy holder that ends up reachable through the relay alone is passed over
// for passOverFor by the caller (copyFailed).
func (x *Exchange) newStream(ctx context.Context, p peer.ID, direct bool) (network.Stream, error) {
	if x.h.Network().Connectedness(p) == network.Connected {
		return x.h.NewStream(ctx, p, ProtocolID)
	}
	addrs := x.circuitAddrs(p)
	if len(addrs) == 0 {
		return x.h.NewStream(ctx, p, ProtocolID)
	}
	x.h.Peerstore().AddAddrs(p, addrs, relayAddrTTL)
	sctx := network.WithAllowLimitedConn(ctx, relayReason)
	if direct {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, holePunchWait)
		defer cancel()
	}
	s, err := x.h.NewStream(sctx, p, ProtocolID)
	// Not once the wait has run out (sctx: a copy's hole punch that did not come).
	if err != nil && sctx.Err() == nil && x.dialAgain(p, err) {
		s, err = x.h.NewStream(sctx, p, ProtocolID)
	}
	// The caller passes the copy holder over (copyFailed); this says why.
	if direct && err != nil && !errors.Is(ctx.Err(), context.Canceled) && x.h.Network().Connectedness(p) == network.Limited {
		x.log.Debug("copy holder reachable only through a relay: not asked for copies for a while",
			"peer", p.String(), "for", passOverFor, "err", err)
	}
	if direct {
		x.closeIdleRelayed(p)
	}
	if err == nil && s.Conn().Stat().Limited {
		x.log.Debug("artifact stream through a relay: no direct connection to the holder", "peer", p.String(),
			"remote", s.Conn().RemoteMultiaddr().String())
	}
	return s, err
}

// closeIdleRelayed closes the relayed connections to p that carry no stream: one made for
// a copy's hole punch has done its work, whether the punch made a direct connection or
// not, and a relay bounds the circuits to one peer (16 by default): the punch attempts of
// a swarm's downloaders must not hold the slots an origin's transfer needs.
func (x *Exchange) closeIdleRelayed(p peer.ID) {
	for _, c := range x.h.Network().ConnsToPeer(p) {
		if c.Stat().Limited && len(c.GetStreams()) == 0 {
			_ = c.Close()
		}
	}
}

// dialAgain says whether a relayed dial to p that failed with err is worth one more try,
// clearing the swarm's backoff of p. go-libp2p's circuit client lets one dial to a peer
// through a relay run at a time and fails the others ("concurrent active dial succeeded"
// or, when that one failed, its error), and the swarm then backs the circuit address off:
// every stream to that holder failed on "dial backoff" for the rest of the pass (the lab:
// a leader behind NAT handed a round on; a late joiner asked no trainer behind NAT for a
// minute). Where the other dial made a connection, the next try takes it; a relay answers
// a dial for a peer without a reservation at once.
func (x *Exchange) dialAgain(p peer.ID, err error) bool {
	if x.h.Network().Connectedness(p) != network.NotConnected {
		return true
	}
	if !isDialRace(err) {
		return false
	}
	if sw, ok := x.h.Network().(interface{ Backoff() *swarm.DialBackoff }); ok {
		sw.Backoff().Clear(p)
		return true
	}
	return false
}

// isDialRace reports whether err is a relayed dial that lost a race with another dial to
// the same peer (go-libp2p's circuit client: "concurrent active dial"), or the backoff
// the swarm set after one: it says nothing of whether the peer can be reached.
func isDialRace(err error) bool {
	return errors.Is(err, swarm.ErrDialBackoff) || strings.Contains(err.Error(), "concurrent active dial")
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
