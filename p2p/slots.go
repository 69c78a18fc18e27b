package p2p

import (
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"

	"github.com/p2pnode/p2pnode/gossip"
)

// Connection slots. The resource manager refuses inbound connections past its system
// limit; the connection manager closes the least valuable connections once there are more
// than its high watermark. With the high watermark below the inbound limit, idle peers
// that take every slot are trimmed and a trainer that arrives meanwhile gets in on a
// redial. The peers the swarm cannot do without are never trimmed: configured validators
// and bootstrap peers are protected, and trainers holding a lease are tagged above idle
// peers.
const (
	// connGrace keeps a new connection from being trimmed: long enough for identify and a
	// first gossip exchange, short enough that a flood of idle peers is trimmed within
	// seconds.
	connGrace = 5 * time.Second
	// connSilence is how often the connection manager checks whether to trim.
	connSilence = 2 * time.Second

	protectKept   = "p2ptrain-kept"  // connmgr protection tag of kept peers
	leaseTag      = "p2ptrain-lease" // connmgr tag of trainers holding a lease
	leaseTagValue = 100
)

// connWatermarks derives the connection manager's watermarks from the resource manager's
// inbound connection limit: the high watermark leaves an eighth of the inbound slots (at
// least 8) free, the low one is three quarters of the high.
func connWatermarks(limits rcmgr.ConcreteLimitConfig) (low, high int) {
	inbound := int(limits.ToPartialLimitConfig().System.ConnsInbound)
	high = max(inbound-max(inbound/8, 8), 2)
	return high * 3 / 4, high
}

// ProtectKeptPeers protects the kept peers (bootstrap peers, configured validators) in
// the connection manager: they are never trimmed, however many other peers take slots.
func ProtectKeptPeers(h host.Host, peers []peer.AddrInfo) {
	for _, ai := range peers {
		h.ConnManager().Protect(ai.ID, protectKept)
	}
}

// leaseTags tags the trainers of the newest round's leases in the connection manager,
// and untags them when a later round is leased. It is used from one goroutine.
type leaseTags struct {
	cm     connmgr.ConnManager
	round  uint64
	tagged map[peer.ID]struct{}
}

func newLeaseTags(cm connmgr.ConnManager) *leaseTags {
	return &leaseTags{cm: cm, tagged: map[peer.ID]struct{}{}}
}

func (lt *leaseTags) observe(m *gossip.Leases) {
	if lt == nil || lt.cm == nil || m.Round < lt.round {
		return
	}
	if m.Round > lt.round {
		for p := range lt.tagged {
			lt.cm.UntagPeer(p, leaseTag)
		}
		clear(lt.tagged)
		lt.round = m.Round
	}
	for _, l := range m.Leases {
		p, err := peer.Decode(l.Trainer)
		if err != nil {
			continue
		}
		lt.cm.TagPeer(p, leaseTag, leaseTagValue)
		lt.tagged[p] = struct{}{}
	}
}
