package gossip

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/lease"
)

// ErrMalformed is wrapped by every decode or schema error.
var ErrMalformed = errors.New("malformed message")

// Size bounds per topic (bytes of the encoded message).
const (
	MaxAnnounceBytes     = 16 << 10
	MaxLeasesBytes       = 1 << 20
	MaxContributionBytes = 64 << 10
	MaxHeadBytes         = chain.MaxHeadBytes + (1+MaxEarlierNotes)*chain.MaxNotesBytes
	MaxAttestationBytes  = MaxAnnounceBytes
	MaxReleaseBytes      = 4 << 10
	// MaxReleaseReason bounds the free-text reason of a release (it ends up in logs).
	MaxReleaseReason = 256

	// MaxHeadSigs bounds the signatures carried with a head (as chain.DecodeSigned does):
	// each costs a signature check, so the bound is also a bound on validation work.
	MaxHeadSigs = 256
)

// AnnounceEvery is how often a node sends its Announce; a peer not heard from for LiveFor
// is taken for gone (a trainer is no longer leased to).
const (
	AnnounceEvery = 2 * time.Second
	LiveFor       = 3 * AnnounceEvery
)

// Announce is a node's periodic "I am here" on the peers topic.
type Announce struct {
	Experiment string             `cbor:"1,keyasint"`
	Peer       string             `cbor:"2,keyasint"`
	Roles      []string           `cbor:"3,keyasint"`
	Capacity   float64            `cbor:"4,keyasint"` // samples per second of training
	Version    string             `cbor:"5,keyasint"`
	Head       []byte             `cbor:"6,keyasint,omitempty"`
	Round      uint64             `cbor:"7,keyasint"`
	Time       int64              `cbor:"8,keyasint"`           // unix milliseconds
	Artifacts  [][]byte           `cbor:"9,keyasint,omitempty"` // recent artifacts this node serves
	Metrics    map[string]float64 `cbor:"10,keyasint,omitempty"`
	// Started is when the announcing process started (unix milliseconds): a new value under
	// the same peer id tells a round's leader that the trainer restarted and lost its lease.
	Started int64 `cbor:"11,keyasint,omitempty"`
	// StepSeconds is the trainer's own measure of its seconds per inner step (its worker's
	// probe, then its windows; 0 unknown): a leader that has observed no window of it yet
	// sets lease deadlines from it.
	StepSeconds float64 `cbor:"12,keyasint,omitempty"`
}

// Leases is the round leader's grant of leases for one round.
type Leases struct {
	Experiment string        `cbor:"1,keyasint"`
	Round      uint64        `cbor:"2,keyasint"`
	Base       []byte        `cbor:"3,keyasint"`
	Issuer     string        `cbor:"4,keyasint"`
	Deadline   int64         `cbor:"5,keyasint"` // unix milliseconds
	Leases     []lease.Lease `cbor:"6,keyasint"`
	Attempt    uint64        `cbor:"7,keyasint"` // increases when a round is re-leased
}

// Contribution announces a trainer's result for a lease.
type Contribution struct {
	Experiment  string   `cbor:"1,keyasint"`
	Round       uint64   `cbor:"2,keyasint"`
	Base        []byte   `cbor:"3,keyasint"`
	Lease       []byte   `cbor:"4,keyasint"`
	Peer        string   `cbor:"5,keyasint"`
	Delta       []byte   `cbor:"6,keyasint"`
	Samples     uint64   `cbor:"7,keyasint"`
	Loss        float64  `cbor:"8,keyasint"`
	Microshards []uint32 `cbor:"9,keyasint"`
	Seconds     float64  `cbor:"10,keyasint"`
	// TrainSeconds is the worker's time for the inner steps and FetchSeconds the trainer's
	// time fetching the base parameters and its microshards (the round's time split).
	TrainSeconds float64 `cbor:"11,keyasint,omitempty"`
	FetchSeconds float64 `cbor:"12,keyasint,omitempty"`
}

// Release is a trainer giving a lease back before its deadline because it cannot finish
// it (its worker failed, the base head cannot be fetched): the round's leader returns the
// lease's microshards to the pool at once instead of waiting out the deadline.
type Release struct {
	Experiment string `cbor:"1,keyasint"`
	Round      uint64 `cbor:"2,keyasint"`
	Base       []byte `cbor:"3,keyasint"`
	Lease      []byte `cbor:"4,keyasint"`
	Peer       string `cbor:"5,keyasint"` // the lease's trainer (the message's author)
	Reason     string `cbor:"6,keyasint,omitempty"`
}

// Head carries a signed head (a proposal or the canonical head) and, outside the signed
// record, the round notes its proposer signed (held-out metrics, rejections, time split)
// and, for a proposal, everything the other validators need to recompute it.
type Head struct {
	Experiment string           `cbor:"1,keyasint"`
	Signed     chain.SignedHead `cbor:"2,keyasint"`
	Notes      *chain.Notes     `cbor:"3,keyasint,omitempty"`
	Proposal   *Proposal        `cbor:"4,keyasint,omitempty"`
	// Sent (unix milliseconds) makes a re-published head a new message: GossipSub drops
	// bytes it has seen, but a head waiting for quorum is sent again for peers that missed
	// it, with every signature gathered so far.
	Sent int64 `cbor:"5,keyasint,omitempty"`
	// Earlier carries the completed notes (chain.Notes.Completed: with held-out metrics, or
	// saying that their evaluation failed) of heads before this one, as the sender holds
	// them: a leader publishes a head before it evaluates it, and the notes it publishes
	// again once it has may miss a peer (not yet subscribed, or synced the head before) for
	// good; the next proposals bring them again (validator/heldout.go).
	Earlier []EarlierNotes `cbor:"6,keyasint,omitempty"`
}

// MaxEarlierNotes bounds Head.Earlier: the heads of the rounds a proposal's notes may
// still complete (a leader evaluates at most two heads behind its proposal, and a peer may
// miss a proposal or two).
const MaxEarlierNotes = 4

// EarlierNotes are the round notes of an earlier head, signed by that head's proposer.
type EarlierNotes struct {
	Head  []byte      `cbor:"1,keyasint"`
	Notes chain.Notes `cbor:"2,keyasint"`
}

// Proposal lists the leases a leader granted for the round and every contribution it
// considered (merged or rejected): merging the same candidates on the same base gives the
// same head CID, which is what a validator checks before it attests.
type Proposal struct {
	Attempt    uint64        `cbor:"1,keyasint"`
	Leases     []lease.Lease `cbor:"2,keyasint"`
	Candidates []Candidate   `cbor:"3,keyasint"`
	// Reference is the artifact of the leader's own reference update the candidates were
	// screened against (validator/reference.go); empty when it screened without one.
	Reference []byte `cbor:"4,keyasint,omitempty"`
}

// Candidate is a contribution a leader considered.
type Candidate struct {
	Peer        string   `cbor:"1,keyasint"`
	Delta       []byte   `cbor:"2,keyasint"`
	Lease       []byte   `cbor:"3,keyasint"`
	Samples     uint64   `cbor:"4,keyasint"`
	Microshards []uint32 `cbor:"5,keyasint"`
	Loss        float64  `cbor:"6,keyasint"`
}

// Attestation is a validator's signature over a head it recomputed.
type Attestation struct {
	Experiment string          `cbor:"1,keyasint"`
	Head       []byte          `cbor:"2,keyasint"`
	Round      uint64          `cbor:"3,keyasint"`
	Sig        chain.Signature `cbor:"4,keyasint"`
	// Sent (unix milliseconds), set when an attestation is sent again, makes it a new
	// message: GossipSub would drop the same bytes as seen, at the sender already.
	Sent int64 `cbor:"5,keyasint,omitempty"`
}

// Encode encodes any message deterministically.
func Encode(v any) ([]byte, error) { return chain.Marshal(v) }

func decode[T any](b []byte, limit int, v *T) error {
	if len(b) > limit {
		return fmt.Errorf("%w: %d bytes exceeds %d", ErrMalformed, len(b), limit)
	}
	if err := chain.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

func checkCID(b []byte, codec uint64, what string) error {
	c, err := cid.Cast(b)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
	}
	if err := cids.Check(c, codec); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
	}
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// DecodeAnnounce decodes and schema-checks an announcement.
func DecodeAnnounce(b []byte) (*Announce, error) {
	var m Announce
	if err := decode(b, MaxAnnounceBytes, &m); err != nil {
		return nil, err
	}
	if m.Peer == "" || len(m.Roles) == 0 || len(m.Roles) > 3 || !finite(m.Capacity) || m.Capacity < 0 || len(m.Artifacts) > 64 ||
		!finite(m.StepSeconds) || m.StepSeconds < 0 || m.Started < 0 {
		return nil, fmt.Errorf("%w: announce from %q: bad fields", ErrMalformed, m.Peer)
	}
	if len(m.Head) > 0 {
		if err := checkCID(m.Head, cids.CodecCBOR, "announce head"); err != nil {
			return nil, err
		}
	}
	for k, v := range m.Metrics {
		if len(k) > 64 || !finite(v) {
			return nil, fmt.Errorf("%w: announce from %s: bad metric %q", ErrMalformed, m.Peer, k)
		}
	}
	return &m, nil
}

// DecodeLeases decodes and schema-checks a lease grant.
func DecodeLeases(b []byte) (*Leases, error) {
	var m Leases
	if err := decode(b, MaxLeasesBytes, &m); err != nil {
		return nil, err
	}
	if m.Round == 0 || m.Issuer == "" {
		return nil, fmt.Errorf("%w: leases: round and issuer required", ErrMalformed)
	}
	if err := checkCID(m.Base, cids.CodecCBOR, "leases base"); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, l := range m.Leases {
		if l.Round != m.Round || !slices.Equal(l.Base, m.Base) || l.Issuer != m.Issuer || seen[l.Trainer] || l.Trainer == "" {
			return nil, fmt.Errorf("%w: leases for round %d: lease for %q does not match its grant", ErrMalformed, m.Round, l.Trainer)
		}
		seen[l.Trainer] = true
	}
	if err := checkMicroshards(m.Leases, leaseLists, "leases"); err != nil {
		return nil, err
	}
	return &m, nil
}

// checkMicroshards holds lists of microshards to the lease package's bounds: none longer
// than a lease may be, and together no more than a round may lease. Those bounds are what
// keep a grant, a contribution and a proposal inside their topics' sizes; a message beyond
// them was not made by a node that follows them. A lease's reservation for the next round
// (lease.Lease.Next) counts toward the round's bound like its microshards.
func checkMicroshards[T any](xs []T, lists func(T) [][]uint32, what string) error {
	total := 0
	for _, x := range xs {
		for _, shards := range lists(x) {
			n := len(shards)
			if n > lease.MaxLeaseMicroshards {
				return fmt.Errorf("%w: %s: a list of %d microshards, at most %d", ErrMalformed, what, n, lease.MaxLeaseMicroshards)
			}
			total += n
		}
	}
	if total > lease.MaxRoundMicroshards {
		return fmt.Errorf("%w: %s: %d microshards in all, at most %d a round", ErrMalformed, what, total, lease.MaxRoundMicroshards)
	}
	return nil
}

// leaseLists are the microshard lists a lease carries: its own and its reservation.
func leaseLists(l lease.Lease) [][]uint32 { return [][]uint32{l.Microshards, l.Next} }

// DecodeContribution decodes and schema-checks a contribution.
func DecodeContribution(b []byte) (*Contribution, error) {
	var m Contribution
	if err := decode(b, MaxContributionBytes, &m); err != nil {
		return nil, err
	}
	if m.Peer == "" || m.Round == 0 || !finite(m.Loss) || !finite(m.Seconds) || !finite(m.TrainSeconds) || !finite(m.FetchSeconds) ||
		m.TrainSeconds < 0 || m.FetchSeconds < 0 {
		return nil, fmt.Errorf("%w: contribution from %q: bad fields", ErrMalformed, m.Peer)
	}
	if err := checkCID(m.Base, cids.CodecCBOR, "contribution base"); err != nil {
		return nil, err
	}
	if err := checkCID(m.Lease, cids.CodecCBOR, "contribution lease"); err != nil {
		return nil, err
	}
	if err := checkCID(m.Delta, cids.CodecCBOR, "contribution delta"); err != nil {
		return nil, err
	}
	if !slices.IsSorted(m.Microshards) {
		return nil, fmt.Errorf("%w: contribution from %s: microshards not sorted", ErrMalformed, m.Peer)
	}
	if len(m.Microshards) > lease.MaxLeaseMicroshards {
		return nil, fmt.Errorf("%w: contribution from %s lists %d microshards, a lease grants at most %d", ErrMalformed, m.Peer, len(m.Microshards), lease.MaxLeaseMicroshards)
	}
	return &m, nil
}

// DecodeRelease decodes and schema-checks a lease release.
func DecodeRelease(b []byte) (*Release, error) {
	var m Release
	if err := decode(b, MaxReleaseBytes, &m); err != nil {
		return nil, err
	}
	if m.Peer == "" || m.Round == 0 || len(m.Reason) > MaxReleaseReason {
		return nil, fmt.Errorf("%w: release from %q: bad fields", ErrMalformed, m.Peer)
	}
	if err := checkCID(m.Base, cids.CodecCBOR, "release base"); err != nil {
		return nil, err
	}
	if err := checkCID(m.Lease, cids.CodecCBOR, "release lease"); err != nil {
		return nil, err
	}
	return &m, nil
}

// DecodeHead decodes a head message and the head inside it.
func DecodeHead(b []byte) (*Head, *chain.Head, error) {
	var m Head
	if err := decode(b, MaxHeadBytes, &m); err != nil {
		return nil, nil, err
	}
	if len(m.Signed.Sigs) > MaxHeadSigs {
		return nil, nil, fmt.Errorf("%w: head carries %d signatures, at most %d", ErrMalformed, len(m.Signed.Sigs), MaxHeadSigs)
	}
	h, err := m.Signed.Decode()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if m.Notes != nil {
		if err := chain.VerifyNotes(m.Signed.ID(), m.Notes); err != nil || m.Notes.Round != h.Round {
			return nil, nil, fmt.Errorf("%w: head round %d: notes: %v", ErrMalformed, h.Round, err)
		}
	}
	if len(m.Earlier) > MaxEarlierNotes {
		return nil, nil, fmt.Errorf("%w: head round %d carries the notes of %d earlier heads, at most %d", ErrMalformed, h.Round, len(m.Earlier), MaxEarlierNotes)
	}
	for _, e := range m.Earlier {
		if err := checkCID(e.Head, cids.CodecCBOR, "earlier head"); err != nil {
			return nil, nil, err
		}
		id, _ := cid.Cast(e.Head)
		if err := chain.VerifyNotes(id, &e.Notes); err != nil || !e.Notes.Completed() || e.Notes.Round >= h.Round {
			return nil, nil, fmt.Errorf("%w: head round %d: notes of earlier head %s (round %d): %v", ErrMalformed, h.Round, id, e.Notes.Round, err)
		}
	}
	if p := m.Proposal; p != nil {
		for _, c := range p.Candidates {
			if c.Peer == "" || !finite(c.Loss) || !slices.IsSorted(c.Microshards) {
				return nil, nil, fmt.Errorf("%w: proposal candidate %q", ErrMalformed, c.Peer)
			}
			if err := checkCID(c.Delta, cids.CodecCBOR, "proposal candidate delta"); err != nil {
				return nil, nil, err
			}
			if err := checkCID(c.Lease, cids.CodecCBOR, "proposal candidate lease"); err != nil {
				return nil, nil, err
			}
		}
		for _, l := range p.Leases {
			if l.Round != h.Round || l.Trainer == "" {
				return nil, nil, fmt.Errorf("%w: proposal lease for %q is not for round %d", ErrMalformed, l.Trainer, h.Round)
			}
		}
		if err := checkMicroshards(p.Leases, leaseLists, "proposal leases"); err != nil {
			return nil, nil, err
		}
		if err := checkMicroshards(p.Candidates, func(c Candidate) [][]uint32 { return [][]uint32{c.Microshards} }, "proposal candidates"); err != nil {
			return nil, nil, err
		}
	}
	return &m, h, nil
}

// DecodeAttestation decodes an attestation.
func DecodeAttestation(b []byte) (*Attestation, error) {
	var m Attestation
	if err := decode(b, MaxAttestationBytes, &m); err != nil {
		return nil, err
	}
	if err := checkCID(m.Head, cids.CodecCBOR, "attestation head"); err != nil {
		return nil, err
	}
	return &m, nil
}
