package chain

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// ErrNotFound is returned for a head the store does not hold.
var ErrNotFound = errors.New("head not found")

func recordCID(b []byte) cid.Cid { return cids.Record(b) }

// Store keeps signed heads as files named by head CID. Writes are atomic; a head is stored
// again when it gains signatures.
type Store struct {
	dir string
	mu  sync.Mutex
}

// OpenStore opens (creating) the head store in dir.
func OpenStore(dir string) (*Store, error) {
	s, err := OpenStoreLeavingTemps(dir)
	if err != nil {
		return nil, err
	}
	// Heads being written when the process died.
	if _, err := atomicfile.RemoveTemps(dir); err != nil {
		return nil, fmt.Errorf("open head store %s: %w", dir, err)
	}
	return s, nil
}

// OpenStoreLeavingTemps opens (creating) the head store in dir beside a node that may be
// running on it: heads it is writing are left alone.
func OpenStoreLeavingTemps(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("open head store %s: %w", dir, err)
	}
	return &Store{dir: dir}, nil
}

func (s *Store) path(id cid.Cid) string { return filepath.Join(s.dir, id.String()) }

// Path is the file a head is stored in, for messages about a damaged one.
func (s *Store) Path(id cid.Cid) string { return s.path(id) }

// List returns the ids of the heads stored (in no particular order); files that are not
// named by a head id are skipped.
func (s *Store) List() ([]cid.Cid, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list heads in %s: %w", s.dir, err)
	}
	var out []cid.Cid
	for _, e := range ents {
		if id, err := cid.Decode(e.Name()); err == nil && e.Type().IsRegular() {
			out = append(out, id)
		}
	}
	return out, nil
}

// Put stores a signed head, merging signatures with any copy already stored. It returns the
// merged signed head.
func (s *Store) Put(sh *SignedHead) (*SignedHead, error) {
	if _, err := DecodeHead(sh.Head); err != nil {
		return nil, err
	}
	id := sh.ID()
	s.mu.Lock()
	defer s.mu.Unlock()
	merged := &SignedHead{Head: sh.Head}
	if old, err := s.getLocked(id); err == nil {
		merged.Sigs = append(merged.Sigs, old.Sigs...)
	}
	changed := len(merged.Sigs) == 0
	for _, sig := range sh.Sigs {
		if VerifySignature(id, sig) == nil && merged.Add(sig) {
			changed = true
		}
	}
	if !changed && s.has(id) {
		return merged, nil
	}
	b, err := EncodeSigned(merged)
	if err != nil {
		return nil, fmt.Errorf("store head %s: %w", id, err)
	}
	if err := atomicfile.Write(s.path(id), b, 0o644); err != nil {
		return nil, fmt.Errorf("store head %s: %w", id, err)
	}
	return merged, nil
}

func (s *Store) has(id cid.Cid) bool {
	_, err := os.Stat(s.path(id))
	return err == nil
}

// Has reports whether the head is stored.
func (s *Store) Has(id cid.Cid) bool { return s.has(id) }

// Get returns a stored head, verifying that its bytes hash to id.
func (s *Store) Get(id cid.Cid) (*SignedHead, *Head, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh, err := s.getLocked(id)
	if err != nil {
		return nil, nil, err
	}
	h, err := sh.Decode()
	if err != nil {
		return nil, nil, fmt.Errorf("head %s: %w", id, err)
	}
	return sh, h, nil
}

func (s *Store) getLocked(id cid.Cid) (*SignedHead, error) {
	b, err := os.ReadFile(s.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read head %s: %w", id, err)
	}
	sh, _, err := DecodeSigned(b)
	if err != nil {
		return nil, fmt.Errorf("head %s: %w", id, err)
	}
	if got := sh.ID(); !got.Equals(id) {
		return nil, fmt.Errorf("head %s: %w: stored bytes hash to %s", id, cids.ErrCorrupt, got)
	}
	return sh, nil
}

// StopWalk, returned by Walk's fn, ends the walk there without an error.
var StopWalk = errors.New("stop the walk")

// Walk calls fn for id and each ancestor back to genesis (newest first), stopping at the
// first error (StopWalk: without one). A missing ancestor is an ErrNotFound error naming it.
func (s *Store) Walk(id cid.Cid, fn func(id cid.Cid, h *Head) error) error {
	for id.Defined() {
		_, h, err := s.Get(id)
		if err != nil {
			return err
		}
		if err := fn(id, h); errors.Is(err, StopWalk) {
			return nil
		} else if err != nil {
			return err
		}
		parent, err := h.ParentID()
		if err != nil {
			return err
		}
		id = parent
	}
	return nil
}

// RecentMerges reads the last n heads back from tip, tip included (fewer at genesis or a
// missing ancestor): the delta artifacts they merged, and for each peer the number of them
// that merged a contribution of it. Validators read it for replays and for each peer's
// standing: every validator counts the same heads, so their verdicts agree.
func (s *Store) RecentMerges(tip cid.Cid, n int) (deltas map[cid.Cid]bool, merges map[string]int) {
	deltas, merges = map[cid.Cid]bool{}, map[string]int{}
	seen := 0
	_ = s.Walk(tip, func(_ cid.Cid, h *Head) error {
		for _, c := range h.Contributions {
			if id, err := cid.Cast(c.Artifact); err == nil {
				deltas[id] = true
			}
			merges[c.Peer]++
		}
		if seen++; seen >= n {
			return StopWalk
		}
		return nil
	})
	return deltas, merges
}

// Chain returns the heads from genesis to id (oldest first).
func (s *Store) Chain(id cid.Cid) ([]cid.Cid, []*Head, error) {
	var ids []cid.Cid
	var heads []*Head
	err := s.Walk(id, func(id cid.Cid, h *Head) error {
		ids = append(ids, id)
		heads = append(heads, h)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for i, j := 0, len(ids)-1; i < j; i, j = i+1, j-1 {
		ids[i], ids[j] = ids[j], ids[i]
		heads[i], heads[j] = heads[j], heads[i]
	}
	return ids, heads, nil
}
