package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/internal/latest"
)

// Sentinel errors callers branch on.
var (
	// ErrNoState is returned by Load when no generation is usable: a fresh node.
	ErrNoState = errors.New("no checkpoint state")
	// ErrClosed is returned by Save and Load after Close.
	ErrClosed = errors.New("checkpointer closed")
)

// keepGenerations is how many state files survive pruning by default: enough that a
// damaged newest state file or blob still leaves something to resume from.
const keepGenerations = 3

// Option changes how a Checkpointer keeps generations.
type Option func(*Checkpointer)

// KeepGenerations keeps the newest n generations (at least 1; default 3). Fewer
// generations reference fewer heads' artifacts in the shared store, so a node that prunes
// that store keeps less.
func KeepGenerations(n int) Option {
	return func(c *Checkpointer) { c.keep = max(n, 1) }
}

// AfterPrune calls f on the writer, after each generation is durable and old generations
// are pruned, with the kept generations (newest first), all of which were readable: the
// moment to prune whatever else the node keeps for them (the shared store), knowing what
// they reference. f is not called when a kept generation is unreadable (what it
// references is then unknown). Saves wait while f runs.
func AfterPrune(f func(kept []*State)) Option {
	return func(c *Checkpointer) { c.afterPrune = f }
}

// Checkpointer saves and loads generations of a node's state in one directory. It is
// safe for concurrent use; writes, whether from Save or SaveAsync, happen one at a time
// in the order they were asked for.
type Checkpointer struct {
	dir    string
	shared *artifact.Store // Keep references live here; may be nil
	own    *artifact.Store // Large blobs, owned and pruned by us
	log    *slog.Logger
	lock   *os.File

	keep       int                 // generations kept
	afterPrune func(kept []*State) // see AfterPrune; may be nil

	// diskMu serialises everything that changes the directory: a generation's write and
	// pruning, and Load's removal of corrupt blobs.
	diskMu  sync.Mutex
	lastSeq uint64 // highest sequence number on disk; guarded by diskMu

	w *latest.Writer[job, *State] // see queue.go
}

// Open opens (creating if needed) the checkpoint directory dir and starts its background
// writer. shared is the node's artifact store that Snapshot.Keep ids refer to (nil if the
// caller never keeps references). Close releases the directory.
func Open(dir string, shared *artifact.Store, log *slog.Logger, opts ...Option) (*Checkpointer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open checkpoint %s: %w", dir, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	c := &Checkpointer{dir: dir, shared: shared, log: log.With("component", "checkpoint", "dir", dir), lock: lock, keep: keepGenerations}
	for _, o := range opts {
		o(c)
	}
	fail := func(err error) (*Checkpointer, error) {
		lock.Close()
		return nil, err
	}
	if c.own, err = artifact.OpenStore(filepath.Join(dir, "blobs"), artifact.Options{}); err != nil {
		return fail(fmt.Errorf("open checkpoint %s: %w", dir, err))
	}
	seqs, err := c.listSeqs()
	if err != nil {
		return fail(err)
	}
	if len(seqs) > 0 {
		c.lastSeq = seqs[0]
	}
	c.removeTemps()
	c.w = c.newWriter()
	return c, nil
}

// Dir is the checkpoint directory.
func (c *Checkpointer) Dir() string { return c.dir }

func (c *Checkpointer) statePath(seq uint64) string {
	return filepath.Join(c.dir, stateName(seq))
}

// listSeqs returns the sequence numbers of the state files on disk, newest first.
func (c *Checkpointer) listSeqs() ([]uint64, error) {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("list checkpoint %s: %w", c.dir, err)
	}
	var seqs []uint64
	for _, e := range ents {
		if seq, ok := parseStateName(e.Name()); ok {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	slices.Reverse(seqs)
	return seqs, nil
}

// removeTemps deletes state files a crash left half-written (atomicfile's temp names);
// nothing else writes in this directory, and we hold its lock.
func (c *Checkpointer) removeTemps() {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, "."+statePrefix) && strings.Contains(n, ".tmp") {
			if err := os.Remove(filepath.Join(c.dir, n)); err == nil {
				c.log.Debug("removed partial state file", "file", n)
			}
		}
	}
}

// readState reads and decodes the state file of generation seq.
func (c *Checkpointer) readState(seq uint64) (*State, error) {
	path := c.statePath(seq)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint state: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxStateBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read checkpoint state %s: %w", path, err)
	}
	st, err := decodeState(b)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint state %s: %w", path, err)
	}
	if st.Seq != seq {
		return nil, fmt.Errorf("read checkpoint state %s: %w: holds generation %d", path, ErrBadState, st.Seq)
	}
	return st, nil
}

// Load returns the newest generation whose state file decodes and whose blobs all verify
// against their CIDs, or ErrNoState. Bad generations are logged and skipped, and a
// corrupt blob in the checkpoint's own store is removed so that the next save of the same
// bytes writes it afresh instead of referencing the damaged file again. Load rehashes
// every blob it checks: expect it to read the state's size from disk.
func (c *Checkpointer) Load() (*State, error) {
	c.diskMu.Lock()
	defer c.diskMu.Unlock()
	if c.lock == nil { // closed: another process may own the directory by now
		return nil, fmt.Errorf("load checkpoint %s: %w", c.dir, ErrClosed)
	}
	seqs, err := c.listSeqs()
	if err != nil {
		return nil, err
	}
	for _, seq := range seqs {
		st, err := c.readState(seq)
		if err == nil {
			err = c.verify(st)
		}
		if err != nil {
			c.log.Warn("skipping checkpoint generation", "seq", seq, "err", err)
			continue
		}
		c.log.Info("loaded checkpoint", "seq", st.Seq, "round", st.Round, "head", st.Head)
		return st, nil
	}
	return nil, fmt.Errorf("%w in %s", ErrNoState, c.dir)
}

// verify rehashes every blob a generation references.
func (c *Checkpointer) verify(st *State) error {
	for _, name := range sortedKeys(st.Blobs) {
		id := st.Blobs[name]
		if err := c.own.Verify(id); err != nil {
			if errors.Is(err, artifact.ErrCorrupt) {
				if rmErr := c.own.Remove(id); rmErr != nil {
					c.log.Warn("cannot remove corrupt blob", "blob", name, "cid", id, "err", rmErr)
				}
			}
			return fmt.Errorf("generation %d: blob %q (%s): %w", st.Seq, name, id, err)
		}
	}
	for _, name := range sortedKeys(st.Refs) {
		id := st.Refs[name]
		if c.shared == nil {
			return fmt.Errorf("generation %d: kept blob %q (%s): no shared artifact store", st.Seq, name, id)
		}
		if err := c.shared.Verify(id); err != nil {
			return fmt.Errorf("generation %d: kept blob %q (%s): %w", st.Seq, name, id, err)
		}
	}
	return nil
}

// OpenBlob maps the named blob of a state, from whichever store holds it.
func (c *Checkpointer) OpenBlob(st *State, name string) (*artifact.Blob, error) {
	store, id, err := c.locate(st, name)
	if err != nil {
		return nil, err
	}
	return store.Open(id)
}

// BlobPath is the read-only file holding the named blob of a state, for handing to the
// Python worker.
func (c *Checkpointer) BlobPath(st *State, name string) (string, error) {
	store, id, err := c.locate(st, name)
	if err != nil {
		return "", err
	}
	return store.BlobPath(id), nil
}

func (c *Checkpointer) locate(st *State, name string) (*artifact.Store, cid.Cid, error) {
	if id, ok := st.Blobs[name]; ok {
		return c.own, id, nil
	}
	if id, ok := st.Refs[name]; ok {
		if c.shared == nil {
			return nil, id, fmt.Errorf("checkpoint blob %q (%s): no shared artifact store", name, id)
		}
		return c.shared, id, nil
	}
	return nil, cid.Undef, fmt.Errorf("checkpoint generation %d has no blob %q", st.Seq, name)
}

// Close waits for queued snapshots to be written, stops the writer and releases the
// directory. It returns the last write's error, like Flush. Calling it again is harmless.
func (c *Checkpointer) Close() error {
	err := c.w.Close(context.Background())
	c.diskMu.Lock()
	defer c.diskMu.Unlock()
	if c.lock != nil {
		c.lock.Close() // drops the flock
		c.lock = nil
	}
	return err
}
