package artifact

import (
	"slices"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Bounds on what gossip can make us remember: announcements come from anyone.
const (
	maxHolderIDs     = 4096
	maxHoldersPerID  = 64
	defaultHolderTTL = time.Hour
)

// holderBook remembers who announced which artifact, and which peers misbehaved.
type holderBook struct {
	mu        sync.Mutex
	ttl       time.Duration
	holders   map[cid.Cid]map[peer.ID]time.Time // last announcement
	penalised map[peer.ID]time.Time             // until
}

func newHolderBook(ttl time.Duration) *holderBook {
	return &holderBook{
		ttl:       ttl,
		holders:   make(map[cid.Cid]map[peer.ID]time.Time),
		penalised: make(map[peer.ID]time.Time),
	}
}

func (b *holderBook) add(id cid.Cid, p peer.ID, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.holders[id]
	if set == nil {
		if len(b.holders) >= maxHolderIDs {
			b.evictOldestID(now)
		}
		set = make(map[peer.ID]time.Time)
		b.holders[id] = set
	}
	if _, ok := set[p]; !ok && len(set) >= maxHoldersPerID {
		evictOldest(set)
	}
	set[p] = now
}

// evictOldestID drops expired ids, or else the id with the stalest announcement.
func (b *holderBook) evictOldestID(now time.Time) {
	var oldest cid.Cid
	var oldestAt time.Time
	for id, set := range b.holders {
		latest := time.Time{}
		for _, at := range set {
			if at.After(latest) {
				latest = at
			}
		}
		if now.Sub(latest) > b.ttl {
			delete(b.holders, id)
			continue
		}
		if !oldest.Defined() || latest.Before(oldestAt) {
			oldest, oldestAt = id, latest
		}
	}
	if len(b.holders) >= maxHolderIDs && oldest.Defined() {
		delete(b.holders, oldest)
	}
}

func evictOldest(set map[peer.ID]time.Time) {
	var victim peer.ID
	var at time.Time
	for p, t := range set {
		if victim == "" || t.Before(at) {
			victim, at = p, t
		}
	}
	delete(set, victim)
}

// get returns the fresh holders of id, most recently announced first.
func (b *holderBook) get(id cid.Cid, now time.Time) []peer.ID {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.holders[id]
	out := make([]peer.ID, 0, len(set))
	for p, at := range set {
		if now.Sub(at) > b.ttl {
			delete(set, p)
			continue
		}
		out = append(out, p)
	}
	if len(set) == 0 {
		delete(b.holders, id)
	}
	slices.SortFunc(out, func(a, c peer.ID) int { return set[c].Compare(set[a]) })
	return out
}

// forget drops every holder record of id (it is complete locally).
func (b *holderBook) forget(id cid.Cid) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.holders, id)
}

func (b *holderBook) penalise(p peer.ID, now time.Time, d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if until := now.Add(d); until.After(b.penalised[p]) {
		b.penalised[p] = until
	}
	// Keep the map bounded by sweeping expired entries as new ones arrive.
	if len(b.penalised) > 1024 {
		for q, until := range b.penalised {
			if now.After(until) {
				delete(b.penalised, q)
			}
		}
	}
}

func (b *holderBook) isPenalised(p peer.ID, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	until, ok := b.penalised[p]
	if !ok {
		return false
	}
	if now.After(until) {
		delete(b.penalised, p)
		return false
	}
	return true
}
