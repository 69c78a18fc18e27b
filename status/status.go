package status

import (
	"fmt"
	"sync"
	"time"

	"github.com/p2pnode/p2pnode/credit"
	"github.com/p2pnode/p2pnode/validator"
)

// MaxContributors bounds Status.Contributors.
const MaxContributors = 200

// Status is what /status reports and `p2pnode status` prints.
type Status struct {
	Peer       string   `json:"peer"`
	Addrs      []string `json:"addrs"`
	Roles      []string `json:"roles"`
	Network    string   `json:"network"`
	Experiment string   `json:"experiment"`
	Connected  []string `json:"connected_peers"`
	// Peers is every node this one knows of (itself first): roles, round and when it was
	// last heard from.
	Peers       []PeerStatus       `json:"peers"`
	Head        string             `json:"head"`
	Round       uint64             `json:"round"`
	Epoch       uint64             `json:"epoch"`
	HeadMetrics map[string]float64 `json:"head_metrics,omitempty"`
	TrainLoss   float64            `json:"train_loss"`
	Leases      []LeaseStatus      `json:"leases_held"`
	Last        *ContributionInfo  `json:"last_contribution,omitempty"`
	Overlap     *OverlapStatus     `json:"overlap,omitempty"`
	Worker      any                `json:"worker,omitempty"`
	Validator   *validator.Status  `json:"validator,omitempty"`
	// Credit is this trainer's own account from the chain (merged, rejected and why,
	// quarantined) and CreditSummary says it in one line; nil on a node that does not train.
	Credit        *credit.Account `json:"credit,omitempty"`
	CreditSummary string          `json:"credit_summary,omitempty"`
	// Contributors are the accounts of every peer the chain held here names, most merged
	// first (at most MaxContributors).
	Contributors []credit.Account `json:"contributors,omitempty"`
	// GossipRejections counts gossip messages from peers that failed topic validation
	// (forged, malformed), by "topic/reason".
	GossipRejections map[string]uint64 `json:"gossip_rejections,omitempty"`
	Events           []Event           `json:"events"`
	History          []RoundPoint      `json:"history"`
	Started          time.Time         `json:"started"`
	// TokensPerSample is how many tokens one sample of the workload trains on (a language
	// model's context), from its worker; 0 when the workload does not count tokens.
	TokensPerSample int64 `json:"tokens_per_sample,omitempty"`
}

// LeaseStatus is a lease this node holds.
type LeaseStatus struct {
	Round       uint64    `json:"round"`
	Lease       string    `json:"lease"`
	Microshards []uint32  `json:"microshards"`
	Expiry      time.Time `json:"expiry"`
}

// OverlapStatus counts the windows this trainer trained under protocol.overlap: eager
// (trainer/ahead.go); nil without it.
type OverlapStatus struct {
	Windows int `json:"windows"`
	// Ahead are the windows trained ahead of their lease, from the trainer's guess at the
	// head; the others were trained from the head once the lease came.
	Ahead int `json:"ahead"`
	// LastMovedAt is the step before which the last window trained ahead was moved onto
	// its head (−1: it had finished before the head came), of LastSteps.
	LastMovedAt int `json:"last_moved_at"`
	LastSteps   int `json:"last_steps"`
}

// ContributionInfo is the last contribution this node published.
type ContributionInfo struct {
	Round   uint64    `json:"round"`
	Delta   string    `json:"delta"`
	Samples uint64    `json:"samples"`
	Loss    float64   `json:"loss"`
	Seconds float64   `json:"seconds"`
	At      time.Time `json:"at"`
}

// RoundPoint is one canonical head in the status history (the dashboard's charts and
// table). Round to Time come from the chain: the head itself and the round notes its
// proposer signed, which travel with the chain, so any node that holds the heads (after a
// restart, or a fresh node that synced) has them. Seconds, BytesIn and BytesOut are this
// node's own measurements, kept in its history file (HistoryFile): absent (0) for rounds
// the node did not follow itself. The bytes are those of its libp2p streams, counted as
// they go (p2p.ByteCounter).
type RoundPoint struct {
	Round     uint64  `json:"round"`
	Head      string  `json:"head"`
	TrainLoss float64 `json:"train_loss"`
	Samples   uint64  `json:"samples"`
	Merged    int     `json:"merged"`
	// HeldOut are the held-out metrics the proposer measured on the head (notes).
	HeldOut map[string]float64 `json:"held_out,omitempty"`
	// HeldOutFailed says the proposer's held-out evaluation of the head failed (notes).
	HeldOutFailed bool `json:"held_out_failed,omitempty"`
	// Rejected counts the contributions the round's leader rejected (notes).
	Rejected int `json:"rejected"`
	// Time is where the round's time went, at its leader (notes).
	Time *RoundTime `json:"time,omitempty"`

	// Seconds is the time from the previous head to this one as this node saw it.
	Seconds float64 `json:"seconds"`
	// BytesIn and BytesOut are what this node received and sent over libp2p during the
	// round.
	BytesIn  uint64 `json:"bytes_in"`
	BytesOut uint64 `json:"bytes_out"`

	// SamplesPerSecond and TokensPerSecond are the swarm's throughput in the round: the
	// samples the head merged over the round's time at its leader (Time), or, without
	// notes, the time this node saw between heads; tokens when the workload counts them
	// (Status.TokensPerSample). Worked out for /status, not kept in the history file.
	SamplesPerSecond float64 `json:"samples_per_second,omitempty"`
	TokensPerSecond  float64 `json:"tokens_per_second,omitempty"`
}

// withRates is p with its throughput worked out (SamplesPerSecond, TokensPerSecond).
func (p RoundPoint) withRates(tokensPerSample int64) RoundPoint {
	secs := p.Seconds
	if p.Time != nil && p.Time.Seconds > 0 {
		secs = p.Time.Seconds
	}
	p.SamplesPerSecond, p.TokensPerSecond = 0, 0
	if secs > 0 && p.Samples > 0 {
		p.SamplesPerSecond = float64(p.Samples) / secs
		if tokensPerSample > 0 {
			p.TokensPerSecond = p.SamplesPerSecond * float64(tokensPerSample)
		}
	}
	return p
}

// RoundTime splits a round's wall time at its leader (chain.Notes): training (the slowest
// merged trainer's inner steps), communication (the longest path of parameters and
// microshards to a trainer and its update back), merge (screening, aggregation, signing),
// and the rest (leasing, gossip, evaluation, waiting for stragglers or deadlines).
type RoundTime struct {
	Seconds       float64 `json:"seconds"`
	Training      float64 `json:"training_seconds"`
	Communication float64 `json:"communication_seconds"`
	Merge         float64 `json:"merge_seconds"`
	Other         float64 `json:"other_seconds"`
}

const MaxHistory = 1000

// Event is something notable that happened (a worker restart, a rejected contribution, a
// re-leased round), newest last.
type Event struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	Text string    `json:"text"`
}

const maxEvents = 50

// Board is the node's shared status, updated by the loops.
type Board struct {
	mu sync.Mutex
	s  Status
	// Worker reports the Python runtime's state when there is one.
	Worker func() any
	// Conns reports connected peers and our addresses when there is a host.
	Conns func() (peers, addrs []string)
	// GossipRejects reports gossip messages rejected by topic validation.
	GossipRejects func() map[string]uint64
	// Peers reports the peer table.
	Peers func(round uint64) []PeerStatus
	// TokensPerSample reports the workload's tokens per sample (Status.TokensPerSample).
	TokensPerSample func() int64
}

// NewBoard is a board that starts at s.
func NewBoard(s Status) *Board { return &Board{s: s} }

// LastPoint is the newest point of the history.
func (b *Board) LastPoint() (RoundPoint, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.s.History) == 0 {
		return RoundPoint{}, false
	}
	return b.s.History[len(b.s.History)-1], true
}

// Update changes the status under the board's lock.
func (b *Board) Update(fn func(s *Status)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fn(&b.s)
}

// Event adds an event (kind, and the text format makes of args), keeping the newest maxEvents.
func (b *Board) Event(kind, format string, args ...any) {
	b.Update(func(s *Status) {
		s.Events = append(s.Events, Event{At: time.Now(), Kind: kind, Text: sprintf(format, args...)})
		if len(s.Events) > maxEvents {
			s.Events = s.Events[len(s.Events)-maxEvents:]
		}
	})
}

// Snapshot returns a copy of the status.
func (b *Board) Snapshot() Status {
	b.mu.Lock()
	s := b.s
	s.Events = append([]Event(nil), b.s.Events...)
	s.Leases = append([]LeaseStatus(nil), b.s.Leases...)
	s.History = append([]RoundPoint(nil), b.s.History...)
	b.mu.Unlock()
	if b.Worker != nil {
		s.Worker = b.Worker()
	}
	if b.GossipRejects != nil {
		if m := b.GossipRejects(); len(m) > 0 {
			s.GossipRejections = m
		}
	}
	if b.Conns != nil {
		s.Connected, s.Addrs = b.Conns()
	}
	if b.Peers != nil {
		s.Peers = b.Peers(s.Round)
	}
	if b.TokensPerSample != nil {
		s.TokensPerSample = b.TokensPerSample()
	}
	for i := range s.History {
		s.History[i] = s.History[i].withRates(s.TokensPerSample)
	}
	return s
}

func sprintf(format string, args ...any) string {
	if len(args) == 0 {
		return format
	}
	return fmt.Sprintf(format, args...)
}
