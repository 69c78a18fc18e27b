package validator

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// LocksFile is written in a validator's store directory, synchronously (fsynced, then
// renamed), before each head it signs leaves the process: the rounds still open and, per
// round, the head message it signed. A restarted validator reads it back so that it never
// signs a second head for a round it had signed before the restart.
const LocksFile = "locks"

// lockRecord is one round's lock in LocksFile. The head goes as its whole gossip message
// (gossip.Encode): the lock is written before the head is offered to the head store, and
// the message's proposal (leases, candidates) and notes are what the other validators need
// to recompute and attest it when it is re-published after a restart.
type lockRecord struct {
	Round uint64 `cbor:"1,keyasint"`
	Head  []byte `cbor:"2,keyasint"`
}

type lockFile struct {
	Locks []lockRecord `cbor:"1,keyasint"`
}

// errLocksFile marks a LocksFile that cannot be read back.
var errLocksFile = errors.New("signing locks unreadable")

// encodeLocks encodes locks in round order.
func encodeLocks(locks map[uint64]lockedHead) ([]byte, error) {
	f := lockFile{Locks: make([]lockRecord, 0, len(locks))}
	for r, l := range locks {
		b, err := gossip.Encode(l.msg)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", r, err)
		}
		f.Locks = append(f.Locks, lockRecord{Round: r, Head: b})
	}
	slices.SortFunc(f.Locks, func(a, b lockRecord) int { return cmp.Compare(a.Round, b.Round) })
	return chain.Marshal(&f)
}

// decodeLocks decodes a LocksFile of validator self in experiment: every lock must be a
// well-formed head message of its round, of this experiment, carrying a valid signature of
// self (anything else is not a file this validator wrote).
func decodeLocks(b []byte, self, experiment string) (map[uint64]lockedHead, error) {
	var f lockFile
	if err := chain.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	locks := make(map[uint64]lockedHead, len(f.Locks))
	for _, rec := range f.Locks {
		m, h, err := gossip.DecodeHead(rec.Head)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", rec.Round, err)
		}
		id := m.Signed.ID()
		sig := chain.FindSignature(m.Signed.Sigs, self)
		switch {
		case h.Round != rec.Round:
			return nil, fmt.Errorf("round %d: head %s is of round %d", rec.Round, id, h.Round)
		case m.Experiment != experiment:
			return nil, fmt.Errorf("round %d: head %s is of experiment %q, not %q", rec.Round, id, m.Experiment, experiment)
		case sig == nil:
			return nil, fmt.Errorf("round %d: head %s carries no signature of this node (%s)", rec.Round, id, self)
		}
		if err := chain.VerifySignature(id, *sig); err != nil {
			return nil, fmt.Errorf("round %d: head %s: %w", rec.Round, id, err)
		}
		if _, dup := locks[rec.Round]; dup {
			return nil, fmt.Errorf("round %d: locked twice", rec.Round)
		}
		locks[rec.Round] = lockedHead{id: id, msg: m}
	}
	return locks, nil
}

func (v *validator) locksPath() string { return filepath.Join(v.Config.Node.StoreDir, LocksFile) }

// lock records that this validator signs head l for round, in memory and in LocksFile,
// before the signature goes anywhere: a validator killed after it published the head
// finds the lock again when it restarts. When the file cannot be written the lock is
// dropped again and nothing may be published: the signature has not left the process.
func (v *validator) lock(round uint64, l lockedHead) error {
	v.locks[round] = l
	b, err := encodeLocks(v.locks)
	if err == nil {
		err = atomicfile.Write(v.locksPath(), b, 0o644)
	}
	if err != nil {
		delete(v.locks, round)
		return fmt.Errorf("record signing lock of round %d (head %s): %w", round, l.id, err)
	}
	return nil
}

// restoreLocks reads the locks of a validator's previous run back from LocksFile, keeping
// those of rounds after the canonical head's (the others are closed). It runs at start-up,
// after the canonical head is restored and before the validator signs anything. A locked
// head the head store lacks (the process died between the lock and the store) goes into
// it again, so that the attestations it gathers count here.
func (v *validator) restoreLocks() error {
	path := v.locksPath()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var locks map[uint64]lockedHead
	if err == nil {
		locks, err = decodeLocks(b, v.Self, v.Config.Experiment.ID)
	}
	_, head := v.Tips.Current()
	if err != nil {
		// Starting without the locks could sign a second head of a round this validator
		// had signed, and with it a second quorum for the round.
		open := "any round"
		if head != nil {
			open = fmt.Sprintf("rounds after %d", head.Round)
		}
		return fmt.Errorf("%w: %s: %v. The file lists the heads this validator signed for rounds not closed here yet (%s); "+
			"without it the validator could sign a second head for one of them, so it does not start. Restore the file, "+
			"or wait until the other validators' canonical head is past those rounds, then delete it and start again",
			errLocksFile, path, err, open)
	}
	for _, r := range slices.Sorted(maps.Keys(locks)) { // a parent goes into the store first
		l := locks[r]
		if head != nil && r <= head.Round {
			delete(locks, r)
			continue
		}
		if !v.Heads.Has(l.id) {
			if _, err := v.Tips.Offer(&l.msg.Signed); err != nil {
				v.Log.Warn("locked head not stored again", "round", r, "head", l.id.String(), "err", err)
			}
		}
		v.Log.Info("restored signing lock: this validator signs no other head for the round", "round", r, "head", l.id.String())
	}
	v.locks = locks
	return nil
}
