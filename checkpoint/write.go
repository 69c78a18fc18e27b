package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// write makes one generation durable: every Large blob (each fsynced by the artifact
// store), then the state file naming them, atomically. Only then is it visible to Load.
func (c *Checkpointer) write(ctx context.Context, s *Snapshot) (*State, error) {
	c.diskMu.Lock()
	defer c.diskMu.Unlock()
	if err := c.check(s); err != nil {
		return nil, err
	}
	seq := c.lastSeq + 1
	st := &State{
		Seq: seq, Round: s.Round, Head: s.Head,
		Blobs: make(map[string]cid.Cid, len(s.Large)+len(s.Streams)),
		Refs:  nonNil(maps.Clone(s.Keep)),
		Meta:  nonNil(maps.Clone(s.Meta)),
		// Whole nanoseconds, no monotonic reading: the value Load will return.
		SavedAt: time.Unix(0, time.Now().UnixNano()),
	}
	for _, name := range sortedKeys(s.Large) {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("checkpoint generation %d: %w", seq, err)
		}
		id, err := c.own.PutBytes(s.Large[name])
		if err != nil {
			return nil, fmt.Errorf("checkpoint generation %d: blob %q: %w", seq, name, err)
		}
		st.Blobs[name] = id
	}
	for _, name := range sortedKeys(s.Streams) {
		id, err := c.putStream(ctx, s.Streams[name])
		if errors.Is(err, ErrNoBlob) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint generation %d: blob %q: %w", seq, name, err)
		}
		st.Blobs[name] = id
	}
	// Blobs written so far are unreferenced if we stop here; the next prune removes them.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("checkpoint generation %d: %w", seq, err)
	}
	b, err := encodeState(st)
	if err != nil {
		return nil, fmt.Errorf("checkpoint generation %d: %w", seq, err)
	}
	if err := atomicfile.Write(c.statePath(seq), b, 0o600); err != nil {
		return nil, fmt.Errorf("checkpoint generation %d: %w", seq, err)
	}
	c.lastSeq = seq
	c.prune()
	return st, nil
}

// putStream writes src into the checkpoint's own store, block by block. A source that ends
// early or runs long, a failed write (a full disk) or ctx ending leaves no blob: the
// artifact store's temporary file is removed and nothing names it.
func (c *Checkpointer) putStream(ctx context.Context, src Source) (cid.Cid, error) {
	if err := ctx.Err(); err != nil {
		return cid.Undef, err
	}
	w, err := c.own.Create()
	if err != nil {
		return cid.Undef, err
	}
	cw := &countWriter{w: ctxWriter{ctx: ctx, w: w}}
	if _, err := src.WriteTo(cw); err != nil {
		w.Abort()
		if errors.Is(err, ErrNoBlob) && cw.n == 0 {
			return cid.Undef, ErrNoBlob
		}
		return cid.Undef, fmt.Errorf("from %s: %w", src.Describe(), err)
	}
	if want := src.Size(); want >= 0 && cw.n != want {
		w.Abort()
		return cid.Undef, fmt.Errorf("from %s: %d bytes written, the source has %d", src.Describe(), cw.n, want)
	}
	return w.Commit()
}

// prune deletes state files beyond the newest c.keep, then every blob in our own
// store that no kept generation references (left by pruned generations or by saves a
// crash interrupted). Failures are logged, not returned: the new generation is durable,
// and the next prune tries again. Caller holds diskMu.
func (c *Checkpointer) prune() {
	seqs, err := c.listSeqs()
	if err != nil {
		c.log.Warn("cannot prune checkpoints", "err", err)
		return
	}
	keep := seqs[:min(len(seqs), c.keep)]
	for _, seq := range seqs[len(keep):] {
		if err := os.Remove(c.statePath(seq)); err != nil {
			c.log.Warn("cannot remove old checkpoint", "seq", seq, "err", err)
		}
	}
	live := make(map[cid.Cid]bool)
	kept := make([]*State, 0, len(keep))
	for _, seq := range keep {
		st, err := c.readState(seq)
		if err != nil {
			// Its blobs are unknown; deleting nothing is the only safe choice until this
			// generation ages out.
			c.log.Warn("not pruning blobs: a kept generation is unreadable", "seq", seq, "err", err)
			return
		}
		for _, id := range st.Blobs {
			live[id] = true
		}
		kept = append(kept, st)
	}
	if c.afterPrune != nil {
		defer c.afterPrune(kept)
	}
	ids, err := c.own.List()
	if err != nil {
		c.log.Warn("cannot prune checkpoint blobs", "err", err)
		return
	}
	for _, id := range ids {
		if live[id] {
			continue
		}
		if err := c.own.Remove(id); err != nil {
			c.log.Warn("cannot remove unreferenced checkpoint blob", "cid", id, "err", err)
		}
	}
}

func nonNil[M ~map[K]V, K comparable, V any](m M) M {
	if m == nil {
		return M{}
	}
	return m
}
