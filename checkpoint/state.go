package checkpoint

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/detcbor"
)

// State is one saved generation of a node's role state.
type State struct {
	// Seq numbers generations; it increases by one per save and names the state file.
	Seq   uint64
	Round uint64
	// Head is the head CID the state belongs to; empty before genesis.
	Head string
	// Blobs are the snapshot's Large blobs, held in the checkpoint's own artifact store.
	Blobs map[string]cid.Cid
	// Refs are the snapshot's Keep references, artifacts in the node's shared store.
	Refs    map[string]cid.Cid
	Meta    map[string]string
	SavedAt time.Time
}

const (
	stateVersion = 1
	// MaxStateBytes bounds a state file: large state belongs in blobs, so anything bigger
	// is damage or an attack, and we refuse to allocate for it.
	MaxStateBytes = 4 << 20
	maxNameBytes  = 256
)

// ErrBadState is wrapped by every state decoding or validation error.
var ErrBadState = errors.New("bad checkpoint state")

// wireState is the state file: deterministic CBOR with small integer keys. CIDs are their
// binary form; time is Unix nanoseconds (no CBOR time tags to negotiate).
type wireState struct {
	Version uint64            `cbor:"1,keyasint"`
	Seq     uint64            `cbor:"2,keyasint"`
	Round   uint64            `cbor:"3,keyasint"`
	Head    string            `cbor:"4,keyasint,omitempty"`
	Blobs   map[string][]byte `cbor:"5,keyasint,omitempty"`
	Refs    map[string][]byte `cbor:"6,keyasint,omitempty"`
	Meta    map[string]string `cbor:"7,keyasint,omitempty"`
	SavedAt int64             `cbor:"8,keyasint"`
}

// The decoder is built from constant limits, so this error cannot really happen; it is kept
// and reported on use rather than panicking at init.
var decMode, decModeErr = detcbor.DecMode(detcbor.Limits{MaxArrayElements: 1 << 16, MaxMapPairs: 1 << 16, MaxNestedLevels: 4})

func encodeState(st *State) ([]byte, error) {
	if err := st.validate(); err != nil {
		return nil, err
	}
	w := wireState{
		Version: stateVersion, Seq: st.Seq, Round: st.Round, Head: st.Head,
		Blobs: cidBytes(st.Blobs), Refs: cidBytes(st.Refs), Meta: st.Meta,
		SavedAt: st.SavedAt.UnixNano(),
	}
	b, err := detcbor.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint state %d: %w", st.Seq, err)
	}
	return b, nil
}

// decodeState decodes and validates a state file's bytes.
func decodeState(b []byte) (*State, error) {
	if decModeErr != nil {
		return nil, fmt.Errorf("decode checkpoint state: %w", decModeErr)
	}
	if len(b) > MaxStateBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrBadState, len(b), MaxStateBytes)
	}
	var w wireState
	if err := decMode.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadState, err)
	}
	if w.Version != stateVersion {
		return nil, fmt.Errorf("%w: version %d unsupported (want %d)", ErrBadState, w.Version, stateVersion)
	}
	st := &State{Seq: w.Seq, Round: w.Round, Head: w.Head, Meta: nonNil(w.Meta), SavedAt: time.Unix(0, w.SavedAt)}
	var err error
	if st.Blobs, err = castCIDs(w.Blobs); err != nil {
		return nil, err
	}
	if st.Refs, err = castCIDs(w.Refs); err != nil {
		return nil, err
	}
	if err := st.validate(); err != nil {
		return nil, err
	}
	return st, nil
}

// validate checks what Load relies on, and what the decoder would refuse if we wrote it.
func (st *State) validate() error {
	if !utf8.ValidString(st.Head) {
		return fmt.Errorf("%w: head is not UTF-8", ErrBadState)
	}
	for name, id := range st.Blobs {
		if err := checkBlob(name, id); err != nil {
			return err
		}
		if _, dup := st.Refs[name]; dup {
			return fmt.Errorf("%w: blob %q is both written and kept", ErrBadState, name)
		}
	}
	for name, id := range st.Refs {
		if err := checkBlob(name, id); err != nil {
			return err
		}
	}
	for k, v := range st.Meta {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("%w: meta %q is not UTF-8", ErrBadState, k)
		}
	}
	return nil
}

func checkBlob(name string, id cid.Cid) error {
	if name == "" || len(name) > maxNameBytes || !utf8.ValidString(name) {
		return fmt.Errorf("%w: blob name %q must be 1 to %d bytes of UTF-8", ErrBadState, name, maxNameBytes)
	}
	if err := cids.Check(id, cids.CodecCBOR); err != nil {
		return fmt.Errorf("%w: blob %q: %w", ErrBadState, name, err)
	}
	return nil
}

func cidBytes(m map[string]cid.Cid) map[string][]byte {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string][]byte, len(m))
	for k, c := range m {
		out[k] = c.Bytes()
	}
	return out
}

func castCIDs(m map[string][]byte) (map[string]cid.Cid, error) {
	out := make(map[string]cid.Cid, len(m))
	for k, b := range m {
		c, err := cid.Cast(b)
		if err != nil {
			return nil, fmt.Errorf("%w: blob %q: %w", ErrBadState, k, err)
		}
		out[k] = c
	}
	return out, nil
}

// State file names carry the sequence number zero-padded, so they sort by generation.
const (
	statePrefix = "state-"
	stateSuffix = ".cbor"
	seqDigits   = 20
)

func stateName(seq uint64) string {
	return fmt.Sprintf("%s%0*d%s", statePrefix, seqDigits, seq, stateSuffix)
}

func parseStateName(name string) (uint64, bool) {
	digits, ok := strings.CutPrefix(name, statePrefix)
	if !ok {
		return 0, false
	}
	if digits, ok = strings.CutSuffix(digits, stateSuffix); !ok || len(digits) != seqDigits {
		return 0, false
	}
	for _, r := range digits {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	seq, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	return seq, true
}
