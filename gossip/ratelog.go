package gossip

import (
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// rejectLog writes a warning for a rejected message at most once per (author, reason) per
// quiet period, and at most budget lines per minute overall. Peer ids are free to mint, so a
// flood of forgeries under fresh ids must not become a flood of log lines; what is held
// back is summed up in one line per minute. Metrics still count every rejection.
type rejectLog struct {
	log    *slog.Logger
	quiet  time.Duration // how long one (author, reason) stays silent after being logged
	budget int           // lines per minute over all keys

	mu         sync.Mutex
	counts     map[string]uint64 // every rejection, by "topic/reason" (a bounded set of keys)
	last       map[string]time.Time
	minute     time.Time
	lines      int
	suppressed int
}

// maxRejectKeys bounds the memory of who was logged; past it, expired keys are dropped and,
// if that is not enough, the map is reset (the line budget still holds).
const maxRejectKeys = 4096

func newRejectLog(log *slog.Logger) *rejectLog {
	return &rejectLog{log: log, quiet: 10 * time.Minute, budget: 20, last: map[string]time.Time{}, counts: map[string]uint64{}}
}

// rejections returns how many messages were rejected, by "topic/reason".
func (r *rejectLog) rejections() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]uint64, len(r.counts))
	for k, n := range r.counts {
		out[k] = n
	}
	return out
}

func (r *rejectLog) reject(now time.Time, k Kind, author, via peer.ID, o *outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[string(k)+"/"+o.reason]++
	if now.Sub(r.minute) >= time.Minute {
		if r.suppressed > 0 {
			r.log.Warn("gossip rejections not logged (rate limit)", "count", r.suppressed, "since", r.minute)
		}
		r.minute, r.lines, r.suppressed = now, 0, 0
	}
	key := author.String() + "\x00" + o.reason
	if t, ok := r.last[key]; ok && now.Sub(t) < r.quiet {
		return // already told; metrics keep the count
	}
	if r.lines >= r.budget {
		r.suppressed++
		return
	}
	r.lines++
	r.remember(now, key)
	r.log.Warn("rejected gossip message", "topic", string(k), "peer", author, "via", via,
		"reason", o.reason, "err", o.err)
}

func (r *rejectLog) remember(now time.Time, key string) {
	if len(r.last) >= maxRejectKeys {
		for k, t := range r.last {
			if now.Sub(t) >= r.quiet {
				delete(r.last, k)
			}
		}
		if len(r.last) >= maxRejectKeys {
			clear(r.last)
		}
	}
	r.last[key] = now
}
