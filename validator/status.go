package validator

import "time"

// Status is what the validator shows on the node's status page: its phase, and as the
// round's leader its view of the open round.
type Status struct {
	// Phase is what the validator is doing now (see Phase).
	Phase       *Phase            `json:"phase,omitempty"`
	Round       uint64            `json:"round"`
	Attempt     uint64            `json:"attempt"`
	Leased      map[string]int    `json:"leased"`
	Received    []string          `json:"received"`
	Deadline    time.Time         `json:"deadline"`
	Trainers    int               `json:"live_trainers"`
	Rejected    map[string]string `json:"rejected_last_round,omitempty"`
	Quarantined map[string]uint64 `json:"quarantined,omitempty"`
	// Barred: trainers that get no further attempt in the open round, and why (rejected
	// contribution, released or expired lease).
	Barred map[string]string `json:"barred,omitempty"`
	// Rejections counts every contribution this validator rejected, by reason; Recent
	// lists the latest (newest last, at most maxRecentRejections).
	Rejections map[string]uint64 `json:"rejections_by_reason,omitempty"`
	Recent     []Rejection       `json:"recent_rejections,omitempty"`
}

// Phase is the step of its loop a validator is in, for which round, since when:
// "waiting" (for genesis from another validator), "issuing" (leading: deciding and
// granting the next attempt's leases), "collecting" (leading: contributions and their
// updates), "proposing" (leading: merging), "awaiting_quorum" (its proposal or the head it
// attested, until a quorum signs it), "following" (another validator leads the round) or
// "standing_aside" (it led the round, and a validator after it took it over).
type Phase struct {
	Name  string    `json:"name"`
	Round uint64    `json:"round"`
	Since time.Time `json:"since"`
}

// Rejection is one rejected contribution.
type Rejection struct {
	At       time.Time `json:"at"`
	Peer     string    `json:"peer"`
	Round    uint64    `json:"round"`
	Reason   string    `json:"reason"`
	Artifact string    `json:"artifact,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

const maxRecentRejections = 20
