package validator

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// trainerSet is the validator's view of the live trainers and their capacity.
type trainerSet struct {
	mu    sync.Mutex
	peers map[string]trainerSeen
	now   func() time.Time
	since time.Time // when this validator began to listen (see seen)
	// tip is this validator's canonical round (ok false: none yet), read with each
	// announcement to tell a trainer that is catching up (see trainerSeen.behind); nil
	// tells none.
	tip func() (round uint64, ok bool)
}

type trainerSeen struct {
	capacity float64
	at       time.Time
	sent     int64   // the time its last announcement carried (unix ms, its clock)
	started  int64   // the process start it announced (unix ms; 0 unknown)
	stepSecs float64 // its own seconds per inner step (0 unknown)
	// samplesPerStep is what a step of its last window read (0 unknown): several batches
	// for a trainer with several ranks (lease.Steps).
	samplesPerStep float64
	// returns counts the times it came back: announced a new process start (a restart)
	// or was heard from again after a gap of more than gossip.LiveFor between its announcements. A leader that
	// sees it change for a trainer it leased knows the lease is lost (lease.Book.Gone).
	returns int
	// how says what the last return was, for the leader's log: "restarted" (a new process
	// start) or "silent for …" (the gap in its announcements). Both settle its lease, but
	// only the first is a restart: a loaded machine or lost gossip makes the second.
	how string
	// steady: its last announcement was read once this validator had listened for gossip.LiveFor,
	// so a gap after it is the trainer's silence (see seen).
	steady bool
	// first is when this validator first heard it; back, when it first heard it since its
	// last return (or first).
	first, back time.Time
	// behind: its last announcement named no head while this validator's is past genesis:
	// a joiner still downloading the model (on the sparse codec the anchor head's, then
	// rebuilding the heads after it: node's env.tryRebuild), which announces itself
	// before it holds any head. Leased, it cannot train on the round's base in time: the
	// attempt waits for it (trainer.baseWait, 10 s), and its missed leases would
	// quarantine it (docs/leadership.md, "Who is leased"). A trainer with an older head is
	// not behind: it rebuilds the heads it missed from their updates, and a lease waits
	// for its base. Leasing one only once its announcement named a recent head cost
	// trainers back from a 30-s cut two rounds in the WAN lab (docs/wan.md).
	behind bool
}

func newTrainerSet() *trainerSet {
	return &trainerSet{peers: map[string]trainerSeen{}, now: time.Now, since: time.Now()}
}

func (t *trainerSet) seen(from string, a *gossip.Announce) {
	if a.Peer != from || !slices.Contains(a.Roles, config.RoleTrainer) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	s, known := t.peers[from]
	// Gossip does not keep one peer's messages in order (it hands a newcomer messages from
	// its peers' caches, after newer ones): an announcement older than the newest one read
	// is a sign of life only. Judged against it, the next would look like a gap.
	if known && a.Time < s.sent {
		s.at = now
		t.peers[from] = s
		return
	}
	// Silence is judged by the sender's own clock (the gap between its announcements that
	// arrived), not by when they were read: a validator busy for a while reads a backlog.
	// And only after an announcement read once this validator had listened for gossip.LiveFor:
	// the first ones it reads may have been sent before it listened, and a gap after one of
	// those is the validator's absence. (A validator that leased in its first seconds took
	// a trainer whose announcements it had missed while starting for one that fell silent
	// and came back, and gave up its lease.)
	if !known {
		s.first, s.back = now, now
	}
	restarted := a.Started != 0 && s.started != 0 && a.Started != s.started
	silent := s.sent != 0 && s.steady && a.Time-s.sent > gossip.LiveFor.Milliseconds()
	if known && (restarted || silent) {
		s.returns++
		s.back = now
		s.how = "restarted"
		if !restarted {
			s.how = "silent for " + (time.Duration(a.Time-s.sent) * time.Millisecond).String()
		}
	}
	s.capacity, s.at, s.sent, s.stepSecs = a.Capacity, now, a.Time, a.StepSeconds
	s.behind = false
	if t.tip != nil {
		if tip, ok := t.tip(); ok {
			s.behind = len(a.Head) == 0 && tip > 0
		}
	}
	s.steady = now.Sub(t.since) >= gossip.LiveFor
	if a.Started != 0 {
		s.started = a.Started
	}
	t.peers[from] = s
}

// measured records the speed a trainer's accepted contribution reports (samples in its
// training seconds, what the trainer itself measures and announces as its capacity), so
// the next round's leases follow it at once rather than after the trainer's next
// announcement: a round can be shorter than gossip.AnnounceEvery. steps (0: unknown) is
// the window's inner steps, which tell the samples one step reads. Only trainers heard
// from are updated; liveness stays with the announcements.
func (t *trainerSet) measured(peer string, samples uint64, seconds float64, steps int) {
	if samples == 0 || seconds <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.peers[peer]; ok {
		s.capacity = float64(samples) / seconds
		if steps > 0 {
			s.samplesPerStep = float64(samples) / float64(steps)
		}
		s.behind = false // it trained on the round's base
		t.peers[peer] = s
	}
}

// heard records a sign of life from a known trainer other than its announcement (a
// contribution on its lease): a trainer whose announcements do not get through while its
// contributions do — just back on a new connection, its gossip not flowing yet — is not
// taken for silent, which would settle the lease it just delivered on (noticeReturns).
func (t *trainerSet) heard(peer string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.peers[peer]; ok {
		s.at = t.now()
		t.peers[peer] = s
	}
}

// returns is how many times peer came back (see trainerSeen.returns).
func (t *trainerSet) returns(peer string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peers[peer].returns
}

// returnedHow says what peer's last return was (see trainerSeen.how).
func (t *trainerSet) returnedHow(peer string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peers[peer].how
}

// isBehind reports whether peer's last announcement said it is catching up (see
// trainerSeen.behind).
func (t *trainerSet) isBehind(peer string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peers[peer].behind
}

// backFor is how long ago peer was first heard since its last return (or first).
func (t *trainerSet) backFor(peer string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.now().Sub(t.peers[peer].back)
}

// isLive reports whether peer was heard from within gossip.LiveFor.
func (t *trainerSet) isLive(peer string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.peers[peer]
	return ok && t.now().Sub(s.at) <= gossip.LiveFor
}

// stepSeconds is the seconds per inner step peer announced (0 unknown).
func (t *trainerSet) stepSeconds(peer string) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peers[peer].stepSecs
}

// joined is when the live trainers were first heard: the earliest and the latest (zero
// with none live).
func (t *trainerSet) joined() (first, last time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	for _, s := range t.peers {
		if now.Sub(s.at) > gossip.LiveFor {
			continue
		}
		if first.IsZero() || s.first.Before(first) {
			first = s.first
		}
		if s.first.After(last) {
			last = s.first
		}
	}
	return first, last
}

// live returns the trainers heard from recently, in peer order.
func (t *trainerSet) live() []lease.Trainer {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var out []lease.Trainer
	for p, s := range t.peers {
		if now.Sub(s.at) <= gossip.LiveFor {
			out = append(out, lease.Trainer{Peer: p, Capacity: s.capacity, SamplesPerStep: s.samplesPerStep})
		}
	}
	slices.SortFunc(out, func(a, b lease.Trainer) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}
