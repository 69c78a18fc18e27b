package chain

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/fxamacker/cbor/v2"
	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/detcbor"
)

// MaxHeadBytes bounds an encoded head (its ledger and contribution list included).
const MaxHeadBytes = 4 << 20

// ErrMalformed is wrapped by decode and validation errors.
var ErrMalformed = errors.New("malformed head")

// Head is one version of the shared model. Its id is the CID of its canonical encoding; it
// holds nothing a validator could not recompute from the parent head and the contributions.
type Head struct {
	Version       uint64         `cbor:"1,keyasint"`
	Network       string         `cbor:"2,keyasint"`
	Experiment    string         `cbor:"3,keyasint"`
	Round         uint64         `cbor:"4,keyasint"`
	Parent        []byte         `cbor:"5,keyasint"`           // parent head CID bytes; empty at genesis
	Params        []byte         `cbor:"6,keyasint"`           // artifact id of the parameter pack
	OuterState    []byte         `cbor:"7,keyasint,omitempty"` // artifact id of the outer momentum (diloco)
	LayoutHash    string         `cbor:"8,keyasint"`
	Contributions []Contribution `cbor:"9,keyasint"`
	Policy        Policy         `cbor:"10,keyasint"`
	Metrics       Metrics        `cbor:"11,keyasint"`
	Ledger        Ledger         `cbor:"12,keyasint"`
	// Reference is the artifact id of the trusted reference update the round was screened
	// with (a validator's own window on the base; empty when there was none). The next
	// round's screening compares its reference with this one (merge.Screening.SetPrevious).
	Reference []byte `cbor:"13,keyasint,omitempty"`
}

// Contribution is one merged trainer result.
type Contribution struct {
	Peer        string   `cbor:"1,keyasint"`
	Artifact    []byte   `cbor:"2,keyasint"` // encoded pseudo-gradient
	Lease       []byte   `cbor:"3,keyasint"` // lease record CID
	Samples     uint64   `cbor:"4,keyasint"`
	Weight      float64  `cbor:"5,keyasint"`
	Microshards []uint32 `cbor:"6,keyasint"`
	Loss        float64  `cbor:"7,keyasint"`
	// Ahead: the microshards are of the epoch after the base head's ledger (the lease was
	// of the next epoch).
	Ahead bool `cbor:"8,keyasint,omitempty"`
}

// Policy records how the head was merged, so it can be recomputed.
type Policy struct {
	Kind       string  `cbor:"1,keyasint"` // diloco | ema
	OuterLR    float64 `cbor:"2,keyasint,omitempty"`
	Momentum   float64 `cbor:"3,keyasint,omitempty"`
	Nesterov   bool    `cbor:"4,keyasint,omitempty"`
	NewWeight  float64 `cbor:"5,keyasint,omitempty"` // ema (config protocol.ema.new_weight)
	Aggregator string  `cbor:"6,keyasint"`
	Codec      string  `cbor:"7,keyasint"`
}

// Metrics are the deterministic numbers of a round, functions of the merged contributions
// only. Held-out evaluation is not part of a head (PyTorch is not bit-exact across
// machines, and validators must agree on the CID), and neither is what was rejected: a
// head depends on what was merged, so a run with attackers screened out produces the same
// chain as the run without them.
type Metrics struct {
	TrainLoss float64 `cbor:"1,keyasint"` // sample-weighted mean of merged contributions
	Samples   uint64  `cbor:"2,keyasint"`
	// Screen is the screening history after this round (absent in heads made before it
	// existed, which decode as "no history").
	Screen *ScreenStats `cbor:"3,keyasint,omitempty"`
}

// ScreenStats is the screening history a head carries to the next round: running
// statistics of the merged contributions' norms and cosines (merge.History), from which the
// next round's calibrated bars are computed. A function of merged contributions only.
type ScreenStats struct {
	Rounds     uint64  `cbor:"1,keyasint"`
	Norm       float64 `cbor:"2,keyasint"`
	CohortN    uint64  `cbor:"3,keyasint,omitempty"`
	CohortMean float64 `cbor:"4,keyasint,omitempty"`
	CohortVar  float64 `cbor:"5,keyasint,omitempty"`
	RefN       uint64  `cbor:"6,keyasint,omitempty"`
	RefMean    float64 `cbor:"7,keyasint,omitempty"`
	RefVar     float64 `cbor:"8,keyasint,omitempty"`
	SelfN      uint64  `cbor:"9,keyasint,omitempty"`
	SelfMean   float64 `cbor:"10,keyasint,omitempty"`
	SelfVar    float64 `cbor:"11,keyasint,omitempty"`
}

// Ledger records which microshards of the dataset plan were consumed in the current epoch.
type Ledger struct {
	Plan     string `cbor:"1,keyasint"` // dataset plan id
	Shards   uint32 `cbor:"2,keyasint"` // microshards in the plan
	Epoch    uint64 `cbor:"3,keyasint"`
	Consumed []byte `cbor:"4,keyasint"` // bitmap, bit i = microshard i consumed this epoch
	// Ahead: bitmap of the next epoch's microshards consumed already (leased ahead while this
	// epoch had none left to lease); absent when none are.
	Ahead []byte `cbor:"5,keyasint,omitempty"`
}

// decMode decodes every record of this package (and gossip's messages) strictly.
var decMode = func() cbor.DecMode {
	m, err := detcbor.DecMode(detcbor.Limits{MaxArrayElements: 1 << 20, MaxMapPairs: 1 << 10, MaxNestedLevels: 8})
	if err != nil {
		panic(err)
	}
	return m
}()

// Marshal encodes a record deterministically (shared by the records of this package).
func Marshal(v any) ([]byte, error) { return detcbor.Marshal(v) }

// Unmarshal decodes a record strictly: unknown fields, duplicate keys and indefinite
// lengths are errors.
func Unmarshal(b []byte, v any) error { return decMode.Unmarshal(b, v) }

// Encode returns the canonical encoding.
func (h *Head) Encode() ([]byte, error) {
	b, err := detcbor.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode head round %d: %w", h.Round, err)
	}
	return b, nil
}

// ID is the head's CID.
func (h *Head) ID() (cid.Cid, error) {
	b, err := h.Encode()
	if err != nil {
		return cid.Undef, err
	}
	return cids.Record(b), nil
}

// DecodeHead decodes and validates a head.
func DecodeHead(b []byte) (*Head, error) {
	if len(b) > MaxHeadBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrMalformed, len(b), MaxHeadBytes)
	}
	var h Head
	if err := decMode.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return &h, nil
}

// ParentID returns the parent CID (cid.Undef at genesis).
func (h *Head) ParentID() (cid.Cid, error) { return castOptional(h.Parent, "parent") }

// ParamsID returns the parameter pack's artifact id.
func (h *Head) ParamsID() (cid.Cid, error) { return castOptional(h.Params, "params") }

// OuterStateID returns the outer optimizer state's artifact id (cid.Undef if none).
func (h *Head) OuterStateID() (cid.Cid, error) { return castOptional(h.OuterState, "outer_state") }

// ReferenceID returns the artifact id of the reference update the round was screened with
// (cid.Undef if none).
func (h *Head) ReferenceID() (cid.Cid, error) { return castOptional(h.Reference, "reference") }

func castOptional(b []byte, field string) (cid.Cid, error) {
	if len(b) == 0 {
		return cid.Undef, nil
	}
	c, err := cid.Cast(b)
	if err != nil {
		return cid.Undef, fmt.Errorf("%w: %s: %v", ErrMalformed, field, err)
	}
	return c, nil
}

// Validate checks the head's internal consistency (not its merge: see round.Verify).
func (h *Head) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: round %d: %s", ErrMalformed, h.Round, fmt.Sprintf(format, args...))
	}
	if h.Version != 1 {
		return bad("version %d unsupported", h.Version)
	}
	if h.Network == "" || h.Experiment == "" {
		return bad("network and experiment must be set")
	}
	if (h.Round == 0) != (len(h.Parent) == 0) {
		return bad("genesis (round 0) and only genesis has no parent")
	}
	if h.Round > 0 {
		if _, err := cid.Cast(h.Parent); err != nil {
			return bad("parent: %v", err)
		}
	}
	params, err := cid.Cast(h.Params)
	if err != nil {
		return bad("params: %v", err)
	}
	if err := cids.Check(params, cids.CodecCBOR); err != nil {
		return bad("params: %v", err)
	}
	if len(h.OuterState) > 0 {
		c, err := cid.Cast(h.OuterState)
		if err != nil {
			return bad("outer_state: %v", err)
		}
		if err := cids.Check(c, cids.CodecCBOR); err != nil {
			return bad("outer_state: %v", err)
		}
	}
	if len(h.Reference) > 0 {
		if _, err := cid.Cast(h.Reference); err != nil {
			return bad("reference: %v", err)
		}
	}
	if len(h.LayoutHash) != 64 {
		return bad("layout_hash must be 64 hex characters")
	}
	for i, c := range h.Contributions {
		if i > 0 && h.Contributions[i-1].Peer >= c.Peer {
			return bad("contributions must be sorted by peer with one per peer")
		}
		if _, err := cid.Cast(c.Artifact); err != nil {
			return bad("contribution %s: artifact: %v", c.Peer, err)
		}
		if math.IsNaN(c.Weight) || math.IsInf(c.Weight, 0) || c.Weight <= 0 {
			return bad("contribution %s: weight %v", c.Peer, c.Weight)
		}
		if !slices.IsSorted(c.Microshards) {
			return bad("contribution %s: microshards not sorted", c.Peer)
		}
	}
	if want := (h.Ledger.Shards + 7) / 8; uint32(len(h.Ledger.Consumed)) != want {
		return bad("ledger bitmap has %d bytes for %d shards", len(h.Ledger.Consumed), h.Ledger.Shards)
	}
	if n := len(h.Ledger.Ahead); n != 0 && n != len(h.Ledger.Consumed) {
		return bad("ledger's ahead bitmap has %d bytes for %d shards", n, h.Ledger.Shards)
	}
	return nil
}
