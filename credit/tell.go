package credit

import (
	"fmt"

	"github.com/p2pnode/p2pnode/chain"
)

// meanings say what each rejection reason means to the trainer whose work it turned away.
var meanings = map[string]string{
	"wrong_base":     "it was trained on another head than the round's; the node catches up and trains on the next lease",
	"forged_peer":    "it was sent in another peer's name",
	"no_lease":       "no validator had leased that work to this node",
	"foreign_lease":  "two validators led the round and the other one's lease won; not counted against this node",
	"late":           "it arrived after the round's deadline; not counted against this node (a faster link or smaller leases help)",
	"lease_mismatch": "it does not match its lease (other microshards or round)",
	"replay":         "the same update was sent before",
	"copy":           "it repeats another peer's update",
	"malformed":      "the update could not be decoded",
	"wrong_codec":    "it is not encoded as the experiment says (protocol.codec and its block and top-k); the node's config may be another experiment's",
	"unavailable":    "the validator could not fetch the update from this node (check that it is reachable)",
	"non_finite":     "the update holds NaN or infinite values (training diverged on this machine)",
	"norm_bound":     "the update is larger than the experiment allows",
	"norm_outlier":   "the update is much larger or smaller than the others of the round",
	"low_cosine":     "the update points away from the others of the round",
	"no_samples":     "it trained no samples",
}

// Meaning says what a rejection reason means to the trainer it turned away.
func Meaning(reason string) string {
	if m, ok := meanings[reason]; ok {
		return m
	}
	return "the validator's reason; see docs/security.md"
}

// Event is something a trainer is told about its own work.
type Event struct {
	Kind   string // EventRejected, EventQuarantined or EventReleased
	Round  uint64 // the round the notes are for (EventReleased: the round it was over by)
	Reason string // EventRejected
	Count  int    // EventRejected: contributions rejected for Reason in the round
	Until  uint64 // EventQuarantined, EventReleased: the quarantine's last round
	By     string // the validator whose notes said so
}

// Event kinds.
const (
	EventRejected    = "rejected"
	EventQuarantined = "quarantined"
	EventReleased    = "released"
)

// String is the event as a trainer's log line says it.
func (e Event) String() string {
	switch e.Kind {
	case EventRejected:
		s := fmt.Sprintf("contribution to round %d rejected: %s (%s)", e.Round, e.Reason, Meaning(e.Reason))
		if e.Count > 1 {
			s = fmt.Sprintf("%d contributions to round %d rejected: %s (%s)", e.Count, e.Round, e.Reason, Meaning(e.Reason))
		}
		return s
	case EventQuarantined:
		return fmt.Sprintf("quarantined through round %d: no leases until then, after repeated rejections or missed leases", e.Until)
	case EventReleased:
		return fmt.Sprintf("quarantine over (it ended with round %d): leases again", e.Until)
	}
	return e.Kind
}

// Teller turns the round notes a node follows into what it is told about its own work.
// Notes may come more than once for a round (first without, then with held-out metrics),
// and out of order while a node catches up; each round is told once, and only rounds after
// the one the teller starts at (a restarted node is not told its history again).
type Teller struct {
	self  string
	after uint64
	told  map[uint64]bool
	until uint64 // last round of the quarantine told, 0 none
}

// NewTeller returns a teller for peer self that tells of rounds after round.
func NewTeller(self string, after uint64) *Teller {
	return &Teller{self: self, after: after, told: map[uint64]bool{}}
}

// Notes returns what notes n of a head of round says of this peer.
func (t *Teller) Notes(n *chain.Notes) []Event {
	if n == nil || n.Round <= t.after || t.told[n.Round] {
		return nil
	}
	t.told[n.Round] = true
	for r := range t.told {
		if r+64 < n.Round {
			delete(t.told, r)
		}
	}
	var out []Event
	count := map[string]int{}
	var order []string
	for _, r := range n.Rejections {
		if r.Peer != t.self {
			continue
		}
		if count[r.Reason] == 0 {
			order = append(order, r.Reason)
		}
		count[r.Reason]++
	}
	for _, reason := range order {
		out = append(out, Event{Kind: EventRejected, Round: n.Round, Reason: reason, Count: count[reason], By: n.Sig.Peer})
	}
	if t.until > 0 && n.Round > t.until {
		out = append(out, Event{Kind: EventReleased, Round: n.Round, Until: t.until, By: n.Sig.Peer})
		t.until = 0
	}
	for _, q := range n.Quarantined {
		if q.Peer == t.self && q.Until >= n.Round && q.Until > t.until {
			out = append(out, Event{Kind: EventQuarantined, Round: n.Round, Until: q.Until, By: n.Sig.Peer})
			t.until = q.Until
		}
	}
	return out
}
