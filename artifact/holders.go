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

// passOverFor is how long a copy holder that failed a download is not asked for copies:
// reachable only through a relay (long enough not to wait on it in every download of a
// round, short enough to try again when its router may let a hole punch through), or
// stalled, or gone. A peer may announce copies of anything: one that lies costs each
// downloader one copyStall a while, not one every download.
const passOverFor = 2 * time.Minute

// holderBook remembers who announced which artifact, and which peers misbehaved.
type holderBook struct {
	mu        sync.Mutex
	ttl       time.Duration
	holders   map[cid.Cid]map[peer.ID]holding
	penalised map[peer.ID]time.Time // until
	// passedOver holds the peers not asked for copies until then (passOverFor).
	passedOver map[peer.ID]time.Time
}

// holding is one peer's announcement of one artifact.
type holding struct {
	at time.Time // last announcement
	// copy marks a peer that said it keeps a copy (gossip.Announce) rather than being an
	// artifact's origin (the trainer of an update, the proposer of a head): a copy is an
	// extra source, asked only over a direct connection (Exchange.AddCopy).
	copy bool
}

// holder is a peer get returns, and whether it holds a copy only.
type holder struct {
	p    peer.ID
	copy bool
}

func newHolderBook(ttl time.Duration) *holderBook {
	return &holderBook{
		ttl:        ttl,
		holders:    make(map[cid.Cid]map[peer.ID]holding),
		penalised:  make(map[peer.ID]time.Time),
		passedOver: make(map[peer.ID]time.Time),
	}
}

// add records p's announcement of id; a peer once recorded as the origin stays one.
func (b *holderBook) add(id cid.Cid, p peer.ID, now time.Time, copy bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.holders[id]
	if set == nil {
		if len(b.holders) >= maxHolderIDs {
			b.evictOldestID(now)
		}
		set = make(map[peer.ID]holding)
		b.holders[id] = set
	}
	old, ok := set[p]
	if !ok && len(set) >= maxHoldersPerID {
		evictOldest(set)
	}
	set[p] = holding{at: now, copy: copy && (!ok || old.copy)}
}

// evictOldestID drops expired ids, or else the id with the stalest announcement.
func (b *holderBook) evictOldestID(now time.Time) {
	var oldest cid.Cid
	var oldestAt time.Time
	for id, set := range b.holders {
		latest := time.Time{}
		for _, h := range set {
			if h.at.After(latest) {
				latest = h.at
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

// evictOldest drops the holder announced longest ago, a copy before any origin: every
// node announces its copies every few seconds, and in a swarm of more than
// maxHoldersPerID nodes they would push out an origin recorded once (a head's proposer,
// an update's trainer).
func evictOldest(set map[peer.ID]holding) {
	var victim peer.ID
	var old holding
	for p, h := range set {
		if victim == "" || h.copy && !old.copy || h.copy == old.copy && h.at.Before(old.at) {
			victim, old = p, h
		}
	}
	delete(set, victim)
}

// get returns the fresh holders of id, most recently announced first.
func (b *holderBook) get(id cid.Cid, now time.Time) []holder {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.holders[id]
	out := make([]holder, 0, len(set))
	for p, h := range set {
		if now.Sub(h.at) > b.ttl {
			delete(set, p)
			continue
		}
		out = append(out, holder{p: p, copy: h.copy})
	}
	if len(set) == 0 {
		delete(b.holders, id)
	}
	slices.SortFunc(out, func(a, c holder) int { return set[c.p].at.Compare(set[a.p].at) })
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

// passOver records that p is not to be asked for copies for passOverFor.
func (b *holderBook) passOver(p peer.ID, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.passedOver[p] = now.Add(passOverFor)
	if len(b.passedOver) > 1024 {
		for q, until := range b.passedOver {
			if now.After(until) {
				delete(b.passedOver, q)
			}
		}
	}
}

// isPassedOver reports whether p is not to be asked for copies now.
func (b *holderBook) isPassedOver(p peer.ID, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	until, ok := b.passedOver[p]
	if ok && now.After(until) {
		delete(b.passedOver, p)
		return false
	}
	return ok
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
