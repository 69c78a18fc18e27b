package trainer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/gossip"
)

// A window trained ahead starts once the round it follows has its last update: every
// trainer leased with this one has published (or the round's head has come). Started at
// once, a trainer that published early ran most of its next window, or all of it, from its
// guess before the head came. On 2 cores shared by three trainers and the validator (lm
// tiny, sparse + overlap) the trainers drifted apart: the one the round waited for had the
// head at step 1–2 of 20, the others at steps 14–19, or after their window had ended. A
// window that ends before its head is published the moment the next lease comes, so its
// trainer is the earliest again the next round, and stays there: every one of its windows
// was trained from a guess. Waiting for the round's last update keeps the trainers in step:
// the head comes after the validators' merge and the leader's held-out evaluation, at
// about the same step in every window. A trainer idles only as long as the slowest trainer
// of its round trains longer than it does.

// maxHeardPerRound bounds the updates remembered for one round (a flood of forged ones
// must not grow the map).
const maxHeardPerRound = 4096

// updates remembers which trainers published an update for the rounds after the canonical
// head, as heard on the bus.
type updates struct {
	mu      sync.Mutex
	rounds  map[uint64]map[string]bool
	changed chan struct{} // closed and replaced whenever an update is heard
}

func newUpdates() *updates {
	return &updates{rounds: map[uint64]map[string]bool{}, changed: make(chan struct{})}
}

// heard records peer's update for round when round is one of the two after cur, the
// canonical head's round (rounds up to cur are forgotten): only those can still have a
// window waiting for them, and no sequence of forged rounds grows the map.
func (u *updates) heard(round, cur uint64, peer string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for r := range u.rounds {
		if r <= cur {
			delete(u.rounds, r)
		}
	}
	if round <= cur || round > cur+2 {
		return
	}
	ps := u.rounds[round]
	if ps == nil {
		ps = map[string]bool{}
		u.rounds[round] = ps
	}
	if ps[peer] || len(ps) >= maxHeardPerRound {
		return
	}
	ps[peer] = true
	close(u.changed)
	u.changed = make(chan struct{})
}

// all reports whether every peer in peers published an update for round, with a channel
// closed at the next update heard.
func (u *updates) all(round uint64, peers []string) (bool, <-chan struct{}) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, p := range peers {
		if !u.rounds[round][p] {
			return false, u.changed
		}
	}
	return true, u.changed
}

// hear records the updates arriving on in until ctx ends; cur is the canonical head's
// round (0 before genesis).
func (u *updates) hear(ctx context.Context, in <-chan bus.Received[gossip.Contribution], cur func() uint64) {
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-in:
			if c.Msg != nil && c.Msg.Peer == c.From {
				u.heard(c.Msg.Round, cur(), c.From)
			}
		}
	}
}

// errHeadFirst: the head a window ahead was to guess at came before the updates it waited
// for (a trainer failed, or was not heard); the lease is trained from that head instead.
var errHeadFirst = errors.New("the head came before the round's last update")

// awaitUpdates waits until every trainer in peers published its update for round; it
// returns how long it waited, errHeadFirst if the head of round became canonical here
// first, or ctx's error.
func (t *Trainer) awaitUpdates(ctx context.Context, round uint64, peers []string) (time.Duration, error) {
	start := time.Now()
	if t.updates == nil || len(peers) == 0 {
		return 0, nil
	}
	for {
		changed := t.Chain.Changed()
		ok, heard := t.updates.all(round, peers)
		if ok {
			return time.Since(start), nil
		}
		if _, h := t.Chain.Current(); h != nil && h.Round >= round {
			return time.Since(start), errHeadFirst
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-heard:
		case <-changed:
		}
	}
}
