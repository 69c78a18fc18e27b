package checkpoint

import (
	"context"
	"errors"
	"fmt"

	"github.com/p2pnode/p2pnode/internal/latest"
)

// job is one snapshot for the writer; waited is set for Save, whose caller hears of a
// failure, so only SaveAsync's failures are logged.
type job struct {
	snap   *Snapshot
	waited bool
}

// newWriter starts the background writer: one generation at a time, in the order asked
// for, so a generation's round never goes backwards because an older snapshot was
// written late; at most one SaveAsync snapshot waits (latest wins).
func (c *Checkpointer) newWriter() *latest.Writer[job, *State] {
	return latest.New(latest.Options[job, *State]{
		Write: func(ctx context.Context, j job) (*State, error) {
			defer j.snap.release()
			st, err := c.write(ctx, j.snap)
			switch {
			case err != nil && !j.waited:
				c.log.Error("background checkpoint failed", "round", j.snap.Round, "err", err)
			case err == nil:
				c.log.Debug("checkpoint saved", "seq", st.Seq, "round", st.Round)
			}
			return st, err
		},
		Drop: func(j job, _ error) { j.snap.release() },
		Name: func(j job) string { return fmt.Sprintf("checkpoint round %d", j.snap.Round) },
		What: "checkpoint",
	})
}

// SaveAsync queues s to be written in the background and returns at once. If a write is
// in progress, s waits; a snapshot already waiting is replaced by s (latest wins), so a
// slow disk costs generations, never memory or the caller's time.
//
// SaveAsync takes ownership of s: its maps and the byte slices in Large must not be
// changed or reused by the caller afterwards, and its Streams are closed by the
// checkpointer (written or dropped). Errors are logged and reported by Flush.
func (c *Checkpointer) SaveAsync(s Snapshot) {
	if err := c.w.Submit(job{snap: &s}); err != nil {
		c.log.Warn("checkpoint dropped: checkpointer closed", "round", s.Round)
	}
}

// Save writes s and returns once its generation is durable. Snapshots queued by SaveAsync
// and not yet started are older than s and are dropped in its favour (even if this save
// then fails). The writer does not use s after Save returns, so the caller may reuse its
// buffers. If ctx ends first, the save is abandoned (a write in progress stops before
// its state file) and ctx's error returned.
func (c *Checkpointer) Save(ctx context.Context, s Snapshot) (*State, error) {
	st, err := c.w.Do(ctx, job{snap: &s, waited: true})
	if errors.Is(err, latest.ErrClosed) {
		return nil, fmt.Errorf("checkpoint round %d: %w", s.Round, ErrClosed)
	}
	return st, err
}

// Flush waits until every snapshot queued before the call is durable or superseded by a
// durable one, and returns the error of the last save handled (nil if it succeeded): an
// error from an earlier write that a later one made moot is not reported.
func (c *Checkpointer) Flush(ctx context.Context) error { return c.w.Flush(ctx) }
