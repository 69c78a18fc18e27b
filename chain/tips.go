package chain

import (
	"fmt"
	"slices"
	"sync"

	"github.com/ipfs/go-cid"
)

// Tips tracks this node's canonical head: the newest head, signed by a quorum of the
// configured validators, whose parent chain the node holds.
type Tips struct {
	heads      *Store
	validators []string // allowed signers; empty = this node alone
	quorum     int

	mu      sync.Mutex
	id      cid.Cid
	head    *Head
	notes   map[cid.Cid]*Notes // recent round notes (also in the head store)
	changed chan struct{}      // closed and replaced on every change
	// notesChanged is closed and replaced whenever SetNotes keeps notes.
	notesChanged chan struct{}
}

// NewTips tracks the canonical head among the heads of store that a quorum of validators
// signed (validators empty: any signer counts).
func NewTips(heads *Store, validators []string, quorum int) *Tips {
	return &Tips{heads: heads, validators: validators, quorum: quorum, changed: make(chan struct{}), notesChanged: make(chan struct{}), notes: map[cid.Cid]*Notes{}}
}

// Validators returns the signers that count toward a quorum (empty: anyone).
func (t *Tips) Validators() []string { return slices.Clone(t.validators) }

// Current returns the canonical head (cid.Undef before genesis).
func (t *Tips) Current() (cid.Cid, *Head) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.id, t.head
}

// Changed returns a channel closed at the next change of the canonical head.
func (t *Tips) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// Metrics returns the held-out metrics its proposer measured for a head, if any.
func (t *Tips) Metrics(id cid.Cid) map[string]float64 {
	if n := t.Notes(id); n != nil {
		return n.HeldOut
	}
	return nil
}

// Notes returns a head's round notes (nil when this node has none).
func (t *Tips) Notes(id cid.Cid) *Notes {
	t.mu.Lock()
	n := t.notes[id]
	t.mu.Unlock()
	if n != nil {
		return n
	}
	n, err := t.heads.Notes(id)
	if err != nil {
		return nil
	}
	return n
}

// SetNotes keeps the round notes announced or fetched with head id: signed (checked by
// the decoder) by one of the configured validators, for the head's round. Notes from anyone
// else are dropped. New notes are written beside the head, so that the history outlives the
// process and is served to peers that sync the chain. Notes once kept stay, except that
// notes whose held-out metrics are due (HeldOutDue) give way to the same signer's notes for
// the head that carry them, or that say the evaluation failed (Notes.Completed): a leader
// publishes its head before it evaluates it, so that the evaluation does not hold the next
// round back, and publishes the notes again once it has (NotesChanged fires then).
func (t *Tips) SetNotes(id cid.Cid, round uint64, n *Notes) error {
	if n == nil || n.Round != round || !slices.Contains(t.validators, n.Sig.Peer) {
		return nil
	}
	t.mu.Lock()
	old := t.notes[id]
	t.mu.Unlock()
	if old == nil {
		old, _ = t.heads.Notes(id) // none stored, or unreadable: these replace them
	}
	if old != nil && !completes(old, n) {
		return nil
	}
	if err := t.heads.PutNotes(id, n); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.notes[id] = n
	if len(t.notes) > 256 {
		for k := range t.notes {
			if !k.Equals(t.id) && !k.Equals(id) {
				delete(t.notes, k)
				break
			}
		}
	}
	close(t.notesChanged)
	t.notesChanged = make(chan struct{})
	return nil
}

// completes reports whether n adds the held-out metrics that old, by the same signer, said
// were due, or says that their evaluation failed.
func completes(old, n *Notes) bool {
	return old.HeldOutDue && n.Completed() && old.Sig.Peer == n.Sig.Peer
}

// NotesChanged returns a channel closed the next time SetNotes keeps notes.
func (t *Tips) NotesChanged() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.notesChanged
}

// Offer stores a signed head and makes it canonical if it has quorum, its parent is known
// (or it is genesis) and it is newer than the current head. It returns whether the head
// became canonical.
func (t *Tips) Offer(sh *SignedHead) (bool, error) {
	h, err := sh.Decode()
	if err != nil {
		return false, err
	}
	id := sh.ID()
	parent, err := h.ParentID()
	if err != nil {
		return false, err
	}
	if parent.Defined() && !t.heads.Has(parent) {
		return false, fmt.Errorf("head %s (round %d): parent %s: %w", id, h.Round, parent, ErrNotFound)
	}
	merged, err := t.heads.Put(sh)
	if err != nil {
		return false, err
	}
	if _, err := merged.Quorum(t.validators, t.quorum); err != nil {
		return false, nil // stored; may reach quorum with more attestations
	}
	return t.set(id, h), nil
}

// Restore sets the canonical head from local state at start-up (already verified).
func (t *Tips) Restore(id cid.Cid, h *Head) { t.set(id, h) }

func (t *Tips) set(id cid.Cid, h *Head) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head != nil && h.Round <= t.head.Round {
		return false
	}
	t.id, t.head = id, h
	close(t.changed)
	t.changed = make(chan struct{})
	return true
}
