package status

import (
	"maps"
	"sync"
	"time"

	"github.com/p2pnode/p2pnode/gossip"
)

// PeerRounds remembers the round each peer last announced.
type PeerRounds struct {
	mu     sync.Mutex
	rounds map[string]announced
}

type announced struct {
	round   uint64
	at      time.Time
	roles   []string
	version string
}

func (p *PeerRounds) Seen(from string, a *gossip.Announce) {
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
func (p *PeerRounds) snapshot() map[string]announced {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.rounds)
}

// AllAt reports whether every peer heard from recently has announced at least round.
func (p *PeerRounds) AllAt(round uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.rounds {
		if time.Since(a.at) <= gossip.LiveFor && a.round < round {
			return false
		}
	}
	return true
}
