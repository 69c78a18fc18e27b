package chain

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// Notes are what a head's proposer measured about its round: the held-out evaluation,
// how many contributions it rejected and where the round's time went. They are kept beside
// the head, not in it: none of it can be recomputed bit for bit by the other validators
// (PyTorch is not bit-exact across machines, timings never are), so it cannot change the
// head's CID. The proposer signs them (for the head's id), so notes fetched from any peer
// with the chain can be checked; what they claim is the proposer's word, not the quorum's.
type Notes struct {
	Round   uint64             `cbor:"1,keyasint"`
	HeldOut map[string]float64 `cbor:"2,keyasint,omitempty"` // held-out metrics, e.g. loss, accuracy
	// Rejected counts the contributions to the round the proposer rejected (screening,
	// leases, replays), over every attempt.
	Rejected uint64 `cbor:"3,keyasint,omitempty"`
	// Seconds is the round's wall time at the proposer, from taking the round to the
	// proposal (the held-out evaluation comes after it, but for the experiment's last
	// round). Train, Comm and Merge split it: the slowest merged trainer's inner steps;
	// the longest transfer path of a merged contribution (the trainer fetching the base
	// parameters and its microshards, then the proposer fetching its update); screening,
	// aggregation and signing. The rest is waiting (leases, gossip, deadlines, stragglers).
	Seconds      float64   `cbor:"4,keyasint,omitempty"`
	TrainSeconds float64   `cbor:"5,keyasint,omitempty"`
	CommSeconds  float64   `cbor:"6,keyasint,omitempty"`
	MergeSeconds float64   `cbor:"7,keyasint,omitempty"`
	Sig          Signature `cbor:"8,keyasint"`
	// HeldOutDue says the proposer evaluates the head after publishing it: the same notes
	// with HeldOut follow (validator/heldout.go). Nodes wait that long before they record
	// the round; notes without it and without HeldOut have no evaluation coming.
	HeldOutDue bool `cbor:"9,keyasint,omitempty"`
	// HeldOutFailed ends what HeldOutDue promised without metrics: the proposer's held-out
	// evaluation of the head failed (its log says why), so nodes need not wait for them.
	HeldOutFailed bool `cbor:"10,keyasint,omitempty"`
	// Rejections names the peer and reason of the round's rejected contributions, in the
	// order the proposer rejected them (at most MaxNoteEntries; Rejected counts them all),
	// so that every node can tell each trainer what became of its work (credit/).
	Rejections []Rejection `cbor:"11,keyasint,omitempty"`
	// Quarantined lists the peers the proposer kept out of leases when it closed the round,
	// each with the last round of its quarantine, sorted by peer (at most MaxNoteEntries).
	Quarantined []Quarantine `cbor:"12,keyasint,omitempty"`
}

// Rejection is one rejected contribution in a round's notes: its author and the reason
// (a validator.RejectReasons value, e.g. norm_outlier).
type Rejection struct {
	Peer   string `cbor:"1,keyasint"`
	Reason string `cbor:"2,keyasint"`
}

// Quarantine is a peer kept out of leases through round Until.
type Quarantine struct {
	Peer  string `cbor:"1,keyasint"`
	Until uint64 `cbor:"2,keyasint"`
}

// MaxNoteEntries bounds the Rejections and the Quarantined of one round's notes: peer ids
// are free to mint, and notes must stay under MaxNotesBytes.
const MaxNoteEntries = 256

// Completed reports whether n ends what notes with HeldOutDue promised: it gives the
// held-out metrics, or says their evaluation failed.
func (n *Notes) Completed() bool { return n.HeldOut != nil || n.HeldOutFailed }

// MaxNotesBytes bounds encoded notes.
const MaxNotesBytes = 64 << 10

// notesDomain separates signatures over notes from head attestations made with the same key.
const notesDomain = "p2ptrain/round-notes/v1\x00"

func notesSignBytes(id cid.Cid, n *Notes) ([]byte, error) {
	c := *n
	c.Sig = Signature{}
	b, err := Marshal(&c)
	if err != nil {
		return nil, err
	}
	return append(append([]byte(notesDomain), id.Bytes()...), b...), nil
}

// SignNotes signs n as the notes of head id with key (setting n.Sig).
func SignNotes(key crypto.PrivKey, id cid.Cid, n *Notes) error {
	if err := n.check(); err != nil {
		return fmt.Errorf("sign notes of head %s: %w", id, err)
	}
	p, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return fmt.Errorf("sign notes of head %s: %w", id, err)
	}
	b, err := notesSignBytes(id, n)
	if err != nil {
		return fmt.Errorf("sign notes of head %s: %w", id, err)
	}
	sig, err := key.Sign(b)
	if err != nil {
		return fmt.Errorf("sign notes of head %s: %w", id, err)
	}
	n.Sig = Signature{Peer: p.String(), Sig: sig}
	return nil
}

// VerifyNotes checks that n is well formed and signed by n.Sig.Peer for head id (whether
// that peer may speak for the round is the caller's call).
func VerifyNotes(id cid.Cid, n *Notes) error {
	if err := n.check(); err != nil {
		return fmt.Errorf("notes of head %s: %w", id, err)
	}
	p, err := peer.Decode(n.Sig.Peer)
	if err != nil {
		return fmt.Errorf("%w: notes of head %s: signer %q: %v", ErrBadSignature, id, n.Sig.Peer, err)
	}
	pub, err := p.ExtractPublicKey()
	if err != nil {
		return fmt.Errorf("%w: notes of head %s: signer %s: %v", ErrBadSignature, id, p, err)
	}
	b, err := notesSignBytes(id, n)
	if err != nil {
		return fmt.Errorf("notes of head %s: %w", id, err)
	}
	if ok, err := pub.Verify(b, n.Sig.Sig); err != nil || !ok {
		return fmt.Errorf("%w: notes of head %s by %s", ErrBadSignature, id, p)
	}
	return nil
}

func (n *Notes) check() error {
	if n.HeldOutDue && n.HeldOut != nil {
		return fmt.Errorf("%w: held-out metrics both given and due", ErrMalformed)
	}
	if n.HeldOutFailed && (n.HeldOutDue || n.HeldOut != nil) {
		return fmt.Errorf("%w: held-out evaluation failed, yet its metrics are given or due", ErrMalformed)
	}
	if len(n.HeldOut) > 64 {
		return fmt.Errorf("%w: %d held-out metrics, at most 64", ErrMalformed, len(n.HeldOut))
	}
	for k, v := range n.HeldOut {
		if k == "" || len(k) > 64 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: held-out metric %q = %v", ErrMalformed, k, v)
		}
	}
	if len(n.Rejections) > MaxNoteEntries || len(n.Quarantined) > MaxNoteEntries {
		return fmt.Errorf("%w: %d rejections and %d quarantined peers, at most %d each", ErrMalformed, len(n.Rejections), len(n.Quarantined), MaxNoteEntries)
	}
	if uint64(len(n.Rejections)) > n.Rejected {
		return fmt.Errorf("%w: %d rejections listed, %d counted", ErrMalformed, len(n.Rejections), n.Rejected)
	}
	for _, r := range n.Rejections {
		if !noteName(r.Peer) || !noteName(r.Reason) {
			return fmt.Errorf("%w: rejection of peer %q for reason %q", ErrMalformed, r.Peer, r.Reason)
		}
	}
	for i, q := range n.Quarantined {
		if !noteName(q.Peer) || (i > 0 && n.Quarantined[i-1].Peer >= q.Peer) {
			return fmt.Errorf("%w: quarantined peer %q (names must be set and sorted, each once)", ErrMalformed, q.Peer)
		}
	}
	for _, s := range []float64{n.Seconds, n.TrainSeconds, n.CommSeconds, n.MergeSeconds} {
		if math.IsNaN(s) || math.IsInf(s, 0) || s < 0 {
			return fmt.Errorf("%w: round time %v", ErrMalformed, s)
		}
	}
	return nil
}

// noteName reports whether s may name a peer or a reason in notes.
func noteName(s string) bool { return s != "" && len(s) <= 128 }

// DecodeNotes decodes notes (without checking the signature: VerifyNotes does).
func DecodeNotes(b []byte) (*Notes, error) {
	if len(b) > MaxNotesBytes {
		return nil, fmt.Errorf("%w: notes of %d bytes, at most %d", ErrMalformed, len(b), MaxNotesBytes)
	}
	var n Notes
	if err := Unmarshal(b, &n); err != nil {
		return nil, fmt.Errorf("%w: notes: %v", ErrMalformed, err)
	}
	if err := n.check(); err != nil {
		return nil, err
	}
	return &n, nil
}

const notesSuffix = ".notes"

// PutNotes stores the notes of head id (replacing any stored before).
func (s *Store) PutNotes(id cid.Cid, n *Notes) error {
	b, err := Marshal(n)
	if err != nil {
		return fmt.Errorf("store notes of head %s: %w", id, err)
	}
	if err := atomicfile.Write(s.path(id)+notesSuffix, b, 0o644); err != nil {
		return fmt.Errorf("store notes of head %s: %w", id, err)
	}
	return nil
}

// Notes returns the stored notes of head id, re-verified (ErrNotFound: none stored).
func (s *Store) Notes(id cid.Cid) (*Notes, error) {
	b, err := os.ReadFile(s.path(id) + notesSuffix)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: notes of %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read notes of head %s: %w", id, err)
	}
	n, err := DecodeNotes(b)
	if err != nil {
		return nil, fmt.Errorf("notes of head %s: %w", id, err)
	}
	if err := VerifyNotes(id, n); err != nil {
		return nil, err
	}
	return n, nil
}
