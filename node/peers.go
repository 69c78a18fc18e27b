package node

import (
	"maps"
	"sync"
	"time"

	"github.com/p2pnode/p2pnode/gossip"
)

// peerRounds remembers the round each peer last announced.
type peerRounds struct {
	mu     sync.Mutex
	rounds map[string]announced
}

type announced struct {
	round   uint64
	at      time.Time
	roles   []string
	version string
}

func (p *peerRounds) seen(from string, a *gossip.Announce) {
	if a.Peer != from {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rounds == nil {
		p.rounds = map[string]announced{}
	}
	p.rounds[from] = announced{round: a.Round, at: time.Now(), roles: a.Roles, version: a.Version}
}

// snapshot copies what each peer last announced.
func (p *peerRounds) snapshot() map[string]announced {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.rounds)
}

// allAt reports whether every peer heard from recently has announced at least round.
func (p *peerRounds) allAt(round uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.rounds {
		if time.Since(a.at) <= gossip.LiveFor && a.round < round {
			return false
		}
	}
	return true
}
