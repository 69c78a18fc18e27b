package lease

import (
	"slices"
	"strings"
	"time"

	"github.com/ipfs/go-cid"
)

// Book is a round leader's record of one round's leases: who holds a lease of the current
// attempt, who reported, and who is barred from the round's further attempts. It decides
// what the leader does next once an attempt is over (Next), so that no trainer can hold a
// round hostage:
//
//   - a trainer whose contribution was rejected, whose lease was released (its worker
//     failed) or expired gets no further attempt in the round: its microshards go back to
//     the pool for the others, and the fastest-failing peer cannot take every re-lease;
//   - an attempt is over as soon as every lease of it is settled (reported or barred), not
//     only at its deadline;
//   - each trainer gets at most one attempt per pass, so a pass has at most as many
//     attempts as there are trainers, however fast they fail;
//   - when every live trainer is barred and nothing was received, a new pass readmits them
//     after a backoff (Backoff, doubling with each pass up to MaxBackoff): the round is not
//     stalled for good by honest updates that screening happened to reject, and nothing a
//     peer sends can make the leader spin;
//   - a trainer that left (its process restarted, or it fell silent) settles its lease at
//     once (Gone), and once it is heard from again (Back) it is readmitted at once if it was
//     barred only for leaving or for letting its lease expire — at most Returns times in the
//     round. A rejected or released lease is never forgiven this way.
//
// A Book is not safe for concurrent use; the leader's loop owns it.
type Book struct {
	Round uint64
	// Backoff is the wait before the round's first new pass, doubled before each further
	// one up to MaxBackoff.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Returns is how many times in the round a trainer may be readmitted after it left and
	// came back (see Gone and Back).
	Returns int

	attempts int                // attempts granted in this round
	held     map[string]cid.Cid // the current attempt's unsettled leases, by trainer
	leased   map[string]bool    // every trainer leased in the round (any attempt)
	reported map[string]bool    // trainers whose contribution is accepted (and not rejected since)
	barred   map[string]string  // trainer → why it gets no further attempt this pass
	gone     map[string]bool    // trainers that left since they were leased or barred
	left     map[string]cid.Cid // leases of the current attempt Gone settled, by trainer (Rehold)
	returned map[string]int     // readmissions after leaving, by trainer
	passes   int
	clean    bool      // the last attempt ended with every lease reported
	lone     bool      // further attempts lease one trainer each (Disagreed)
	fresh    int       // contributions accepted in the current attempt
	dropped  int       // leases of the current attempt settled by a bar
	ended    time.Time // when the last attempt ended (or the round started)
}

// Default backoff before a new pass.
const (
	DefaultBackoff    = 3 * time.Second
	DefaultMaxBackoff = 24 * time.Second
	// DefaultReturns: a trainer restarted within its round is leased once more in it.
	DefaultReturns = 1
)

// Bar reasons the book gives itself; the leader uses any other reason it likes.
const (
	ReasonExpired = "expired" // the lease's deadline passed without a contribution
	ReasonGone    = "gone"    // its trainer left (restarted or fell silent) while holding it
)

// NewBook starts the book of a round at now.
func NewBook(round uint64, now time.Time) *Book {
	return &Book{Round: round, Backoff: DefaultBackoff, MaxBackoff: DefaultMaxBackoff, Returns: DefaultReturns,
		held: map[string]cid.Cid{}, leased: map[string]bool{}, reported: map[string]bool{}, barred: map[string]string{},
		gone: map[string]bool{}, left: map[string]cid.Cid{}, returned: map[string]int{}, ended: now}
}

// Candidates returns, in peer order, the trainers that may be leased in the next attempt:
// those in live that did not report, are not barred and hold no lease.
func (b *Book) Candidates(live []Trainer) []Trainer {
	var out []Trainer
	for _, t := range live {
		if _, held := b.held[t.Peer]; held || b.reported[t.Peer] || b.barred[t.Peer] != "" {
			continue
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Trainer) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}

// Grant records a new attempt's leases. Leases of an earlier attempt still unsettled are
// dropped (the caller grants only once the last attempt is over).
func (b *Book) Grant(leases []Lease) {
	b.attempts++
	clear(b.held)
	clear(b.left)
	b.fresh, b.dropped, b.clean = 0, 0, false
	for _, l := range leases {
		b.held[l.Trainer] = l.ID()
		b.leased[l.Trainer] = true
	}
}

// Holds reports whether peer holds the lease id in the current attempt, unsettled.
func (b *Book) Holds(peer string, id cid.Cid) bool {
	h, ok := b.held[peer]
	return ok && h.Equals(id)
}

// Leased reports whether peer was leased in any attempt of the round.
func (b *Book) Leased(peer string) bool { return b.leased[peer] }

// Report settles peer's lease with an accepted contribution.
func (b *Book) Report(peer string) {
	if _, ok := b.held[peer]; !ok {
		return
	}
	delete(b.held, peer)
	b.reported[peer] = true
	b.fresh++
}

// Bar keeps peer out of the round's further attempts (its contribution was rejected, or its
// lease released or expired) and settles its lease; a contribution of peer accepted earlier
// no longer counts. Only peers leased in the round are barred (anyone else has nothing to
// take back, and a flood under fresh peer ids must not grow the book). It reports whether
// peer was newly barred.
func (b *Book) Bar(peer, reason string) bool {
	if !b.leased[peer] || b.barred[peer] != "" {
		return false
	}
	if reason == "" {
		reason = "barred"
	}
	if _, held := b.held[peer]; held {
		delete(b.held, peer)
		b.dropped++
	}
	delete(b.reported, peer)
	b.barred[peer] = reason
	return true
}

// Barred returns the barred peers with the reason of each.
func (b *Book) Barred() map[string]string {
	out := make(map[string]string, len(b.barred))
	for p, r := range b.barred {
		out[p] = r
	}
	return out
}

// Settled reports whether the current attempt has no lease left unsettled.
func (b *Book) Settled() bool { return len(b.held) == 0 }

// Expire bars every holder of an unsettled lease (the attempt's deadline passed) and
// returns them in peer order.
func (b *Book) Expire() []string { return b.ExpireExcept(nil) }

// ExpireExcept is Expire for the holders arriving does not name (nil: every holder): a
// holder whose contribution arrived in time and is still being fetched keeps its lease
// until the fetch settles it (Report or Bar).
func (b *Book) ExpireExcept(arriving func(peer string) bool) []string {
	var out []string
	for p := range b.held {
		if arriving == nil || !arriving(p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	for _, p := range out {
		b.Bar(p, ReasonExpired)
	}
	return out
}

// Gone records that peer left: its process restarted (it announced a new start), or it was
// not heard from for a while. An unsettled lease it holds is settled at once, barring it
// (ReasonGone), so its microshards go back to the pool without waiting out the deadline;
// Gone reports whether it settled one. Peers not leased in the round are not recorded.
func (b *Book) Gone(peer string) bool {
	if !b.leased[peer] {
		return false
	}
	b.gone[peer] = true
	id, held := b.held[peer]
	if held && b.Bar(peer, ReasonGone) {
		b.left[peer] = id
		return true
	}
	return false
}

// Rehold gives peer back lease id, which Gone settled in the current attempt, and reports
// whether it did: the trainer was only out of touch (a home router that forgot its
// mappings, a link down for seconds), trained its window all the same, and its
// contribution on the lease arrives while the attempt is still open. Nothing else has
// been done with the lease's microshards (they return to the pool only for a later
// attempt), so the contribution counts as if the lease had never been settled. Refused
// once the attempt ended, when peer holds or reported another lease, or was barred for
// anything but leaving; it counts as one of peer's Returns.
func (b *Book) Rehold(peer string, id cid.Cid) bool {
	left, ok := b.left[peer] // emptied when an attempt is granted or ends
	if !ok || !left.Equals(id) {
		return false
	}
	if _, held := b.held[peer]; held || b.reported[peer] {
		return false
	}
	switch b.barred[peer] {
	case "":
		// Readmitted already (Back), which was its return; it got nothing since.
	case ReasonGone:
		if b.returned[peer] >= b.Returns {
			return false
		}
		b.returned[peer]++
	default:
		return false
	}
	delete(b.left, peer)
	delete(b.gone, peer)
	delete(b.barred, peer)
	b.held[peer] = id
	b.dropped--
	return true
}

// Back readmits peer to the round's further attempts, and reports whether it did, when it
// is heard from again after Gone, was barred only for leaving or for an expired lease (not
// for a rejected contribution or a released lease), and has been readmitted fewer than
// Returns times in the round. So a restarted trainer is leased again at once, while a
// trainer whose contribution was rejected stays out however often it reconnects, and none
// gets more than Returns extra attempts a round by leaving and coming back.
func (b *Book) Back(peer string) bool {
	if !b.gone[peer] {
		return false
	}
	switch b.barred[peer] {
	case ReasonGone, ReasonExpired:
	default:
		return false
	}
	if b.returned[peer] >= b.Returns {
		return false
	}
	delete(b.gone, peer)
	delete(b.barred, peer)
	b.returned[peer]++
	return true
}

// End closes the current attempt at now (all settled, or the deadline passed after
// Expire).
func (b *Book) End(now time.Time) {
	if b.attempts == 0 {
		return
	}
	b.clean = len(b.held) == 0 && b.fresh > 0 && b.dropped == 0
	clear(b.held)
	clear(b.left)
	b.ended = now
}

// passDelay is how long after the last attempt the next new pass may start.
func (b *Book) passDelay() time.Duration {
	d := b.Backoff
	for i := 0; i < b.passes && d < b.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, b.MaxBackoff)
}

// Discard records that every contribution received so far was rejected at screening
// (nothing merged) at now.
func (b *Book) Discard(now time.Time) {
	b.clean = false
	b.ended = now
}

// Disagreed records that the contributions just discarded were rejected for pointing away
// from each other (two updates held to each other, with nothing else to judge them by). A
// retry on the same base and microshards disagrees again, whatever its seed: an epoch's
// tail of one microshard per trainer, trained for a whole window on a model near
// convergence, gave two honest updates at cosine −0.26 on every attempt, and the round
// never closed. From now on the round leases one trainer per attempt (Lone): a lone update
// is not held to another's direction. Bar and quarantine stay as they are.
func (b *Book) Disagreed() { b.lone = true }

// Lone reports whether the round leases one trainer per attempt (see Disagreed).
func (b *Book) Lone() bool { return b.lone }

// Attempts is how many attempts were granted in the round.
func (b *Book) Attempts() int { return b.attempts }

// Passes is how many times every barred peer was readmitted.
func (b *Book) Passes() int { return b.passes }

// Step is what a leader does next in a round.
type Step int

const (
	// Wait for trainers, microshards or the backoff to pass.
	Wait Step = iota
	// Grant leases to the candidates.
	Grant
	// Close the round: merge what was received and propose.
	Close
	// NewPass readmits every barred peer (nothing was received and no one else is left).
	NewPass
)

func (s Step) String() string {
	switch s {
	case Grant:
		return "grant"
	case Close:
		return "close"
	case NewPass:
		return "new_pass"
	}
	return "wait"
}

// Situation is what the leader knows when it decides.
type Situation struct {
	Received   int // contributions accepted in the round and not rejected since
	MinGroup   int
	Candidates int // trainers that may be leased now (Candidates, after quarantine)
	Barred     int // live trainers barred this pass
	Available  int // microshards not covered by received contributions
	// Patience is how long a round that has contributions, but fewer than MinGroup, waits
	// for further trainers once no candidate is left (one round deadline).
	Patience time.Duration
}

// Next decides the leader's next step at now. The round closes with what it received once
// that is the minimum group, once the last attempt's trainers all reported (an epoch tail
// with fewer microshards than trainers), once no microshard is left, or once it has waited
// Patience with no candidate to lease to. It leases again to candidates at once (never to
// barred peers); the round's first attempt waits for a minimum group.
func (b *Book) Next(now time.Time, s Situation) Step {
	switch {
	case s.Received > 0 && s.Received >= s.MinGroup:
		return Close
	case s.Received > 0 && b.clean:
		return Close
	case s.Received > 0 && s.Available == 0:
		return Close
	}
	// The round's first attempt waits for a minimum group; once the round is under way,
	// whoever is left gets the microshards the others failed.
	if s.Candidates > 0 && s.Available > 0 && (s.Received > 0 || s.Candidates >= s.MinGroup || b.attempts > 0) {
		return Grant
	}
	if s.Received > 0 && now.Sub(b.ended) >= s.Patience {
		return Close
	}
	if s.Received == 0 && s.Candidates == 0 && s.Barred > 0 && s.Available > 0 && s.Barred >= s.MinGroup && !now.Before(b.ended.Add(b.passDelay())) {
		return NewPass
	}
	return Wait
}

// StartPass readmits every barred peer (see NewPass); the wait before the next pass
// doubles, so a fleet whose every update is rejected is re-leased ever more slowly, never
// in a spin.
func (b *Book) StartPass() {
	clear(b.barred)
	b.passes++
}
