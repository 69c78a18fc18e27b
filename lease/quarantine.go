package lease

import "sort"

// Quarantine keeps repeat offenders out of leases: a peer with Threshold rejected
// contributions within Window rounds gets no leases for Rounds rounds. It is a validator's
// local policy (not part of any head), so validators need not agree on it.
type Quarantine struct {
	Threshold int
	Window    uint64
	Rounds    uint64

	rejected map[string][]uint64 // rounds of recent rejections
	until    map[string]uint64   // quarantined through this round
}

// NewQuarantine returns a policy; rounds 0 disables quarantine.
func NewQuarantine(threshold int, window, rounds uint64) *Quarantine {
	return &Quarantine{Threshold: max(1, threshold), Window: window, Rounds: rounds,
		rejected: map[string][]uint64{}, until: map[string]uint64{}}
}

// Reject records a rejected contribution of peer in round and reports whether that put the
// peer into quarantine.
func (q *Quarantine) Reject(peer string, round uint64) bool {
	if q.Rounds == 0 {
		return false
	}
	recent := q.rejected[peer][:0]
	for _, r := range q.rejected[peer] {
		if r+q.Window > round {
			recent = append(recent, r)
		}
	}
	recent = append(recent, round)
	q.rejected[peer] = recent
	if len(recent) >= q.Threshold && !q.Quarantined(peer, round) {
		q.until[peer] = round + q.Rounds
		q.rejected[peer] = nil
		return true
	}
	return false
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
