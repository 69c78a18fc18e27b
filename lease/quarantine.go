package lease

import (
	"slices"
	"sort"
)

// Quarantine keeps repeat offenders out of leases: a peer with Threshold rejected
// contributions within Window rounds gets no leases for Rounds rounds. A soft rejection (a
// statistical one, such as a low cosine to the cohort, which an honest peer also gets now
// and then when honest updates barely agree) counts half: it takes twice as many. It is a
// validator's local policy (not part of any head), so validators need not agree on it.
type Quarantine struct {
	Threshold int
	Window    uint64
	Rounds    uint64

	rejected map[string][]strike // recent rejections
	until    map[string]uint64   // quarantined through this round
}

type strike struct {
	round  uint64
	points int // 2 for a rejection, 1 for a soft one
}

// NewQuarantine returns a policy; rounds 0 disables quarantine.
func NewQuarantine(threshold int, window, rounds uint64) *Quarantine {
	return &Quarantine{Threshold: max(1, threshold), Window: window, Rounds: rounds,
		rejected: map[string][]strike{}, until: map[string]uint64{}}
}

// Reject records a rejected contribution of peer in round (soft: a statistical rejection)
// and reports whether that put the peer into quarantine.
func (q *Quarantine) Reject(peer string, round uint64, soft bool) bool {
	if q.Rounds == 0 {
		return false
	}
	recent := q.rejected[peer][:0]
	points := 0
	for _, s := range q.rejected[peer] {
		if q.recent(s, round) {
			recent = append(recent, s)
			points += s.points
		}
	}
	s := strike{round: round, points: 2}
	if soft {
		s.points = 1
	}
	recent = append(recent, s)
	points += s.points
	q.rejected[peer] = recent
	if points >= 2*q.Threshold && !q.Quarantined(peer, round) {
		q.until[peer] = round + q.Rounds
		q.rejected[peer] = nil
		return true
	}
	return false
}

// Struck reports whether peer has a rejection or a miss within Window rounds before round
// that has not yet put it into quarantine: such a peer is not served first at an epoch's
// tail (Trainer.Proven), whatever the chain merged of it before.
func (q *Quarantine) Struck(peer string, round uint64) bool {
	return slices.ContainsFunc(q.rejected[peer], func(s strike) bool { return q.recent(s, round) })
}

// recent reports whether strike s still counts at round (within Window rounds of it).
func (q *Quarantine) recent(s strike, round uint64) bool { return s.round+q.Window > round }

// Miss records that peer's lease of round came to nothing (it expired, or the trainer
// released it because its worker failed) and reports whether that put the peer into
// quarantine. A miss counts like a soft rejection (honest machines crash now and then): a
// trainer that always fails is kept out after twice as many misses as rejections, instead
// of being leased round after round.
func (q *Quarantine) Miss(peer string, round uint64) bool { return q.Reject(peer, round, true) }

// Eligible picks the trainers to lease to in round from those available: the ones not in
// quarantine. Quarantine is counted in rounds, and rounds need trainers: when it leaves
// none, or fewer than minGroup together with the have contributions already received,
// every available trainer is eligible (the whole cohort, so that screening has others to
// compare each update with) and relaxed is true, rather than the run stalling for good.
func (q *Quarantine) Eligible(available []Trainer, round uint64, have, minGroup int) (out []Trainer, relaxed bool) {
	for _, t := range available {
		if !q.Quarantined(t.Peer, round) {
			out = append(out, t)
		}
	}
	if len(out) < len(available) && (len(out) == 0 || len(out)+have < minGroup) {
		return available, true
	}
	return out, false
}

// Quarantined reports whether peer may not be leased to in round.
func (q *Quarantine) Quarantined(peer string, round uint64) bool {
	u, ok := q.until[peer]
	return ok && round <= u
}

// List returns the peers quarantined in round and the last round of their quarantine.
func (q *Quarantine) List(round uint64) map[string]uint64 {
	out := map[string]uint64{}
	peers := make([]string, 0, len(q.until))
	for p := range q.until {
		peers = append(peers, p)
	}
	sort.Strings(peers)
	for _, p := range peers {
		if u := q.until[p]; round <= u {
			out[p] = u
		}
	}
	return out
}
