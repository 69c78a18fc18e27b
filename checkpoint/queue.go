package checkpoint

import (
	"context"
	"fmt"
	"sync"
)

// request is one snapshot waiting for the writer. Tickets number requests in the order
// they were made; the writer handles them in that order, so a generation's round never
// goes backwards because an older snapshot was written late.
type request struct {
	snap   *Snapshot
	ticket uint64
	ctx    context.Context // nil for SaveAsync
	result chan result     // nil for SaveAsync; buffered
	// started is set when the writer takes the request, skip when a Save gave up on it
	// before that. Both guarded by queue.mu.
	started, skip bool
}

type result struct {
	st  *State
	err error
}

// queue holds requests not yet started; at most one SaveAsync snapshot waits at its tail.
type queue struct {
	mu      sync.Mutex
	items   []*request
	issued  uint64        // last ticket handed out
	done    uint64        // every ticket ≤ done is written, failed, or superseded
	lastErr error         // result of the last write
	changed chan struct{} // closed (and replaced) whenever done moves
	wake    chan struct{} // tells the writer there is work; capacity 1
	closed  bool
	stopped chan struct{} // closed when the writer exits
}

func (q *queue) init() {
	q.changed = make(chan struct{})
	q.wake = make(chan struct{}, 1)
	q.stopped = make(chan struct{})
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// SaveAsync queues s to be written in the background and returns at once. If a write is
// in progress, s waits; a snapshot already waiting is replaced by s (latest wins), so a
// slow disk costs generations, never memory or the caller's time.
//
// SaveAsync takes ownership of s: its maps and the byte slices in Large must not be
// changed or reused by the caller afterwards, and its Streams are closed by the
// checkpointer (written or dropped). Errors are logged and reported by Flush.
func (c *Checkpointer) SaveAsync(s Snapshot) {
	q := &c.q
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		s.release()
		c.log.Warn("checkpoint dropped: checkpointer closed", "round", s.Round)
		return
	}
	q.issued++
	r := &request{snap: &s, ticket: q.issued}
	var dropped *Snapshot
	if n := len(q.items); n > 0 && q.items[n-1].result == nil {
		dropped = q.items[n-1].snap
		q.items[n-1] = r
	} else {
		q.items = append(q.items, r)
	}
	q.mu.Unlock()
	if dropped != nil {
		dropped.release()
	}
	q.signal()
}

// Save writes s and returns once its generation is durable. Snapshots queued by SaveAsync
// and not yet started are older than s and are dropped in its favour (even if this save
// then fails). The writer does not use s after Save returns, so the caller may reuse its
// buffers. If ctx ends first, the save is abandoned (a write in progress stops before
// its state file) and ctx's error returned.
func (c *Checkpointer) Save(ctx context.Context, s Snapshot) (*State, error) {
	q := &c.q
	r := &request{snap: &s, ctx: ctx, result: make(chan result, 1)}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		s.release()
		return nil, fmt.Errorf("checkpoint round %d: %w", s.Round, ErrClosed)
	}
	q.issued++
	r.ticket = q.issued
	kept := q.items[:0]
	var dropped []*Snapshot
	for _, it := range q.items {
		if it.result != nil { // another caller's Save: it waits for its own answer
			kept = append(kept, it)
		} else {
			dropped = append(dropped, it.snap)
		}
	}
	clear(q.items[len(kept):])
	q.items = append(kept, r)
	q.mu.Unlock()
	for _, d := range dropped {
		d.release()
	}
	q.signal()

	select {
	case res := <-r.result:
		return res.st, res.err
	case <-ctx.Done():
	}
	q.mu.Lock()
	if !r.started {
		r.skip = true
		q.mu.Unlock()
		return nil, fmt.Errorf("checkpoint round %d: %w", s.Round, ctx.Err())
	}
	q.mu.Unlock()
	// Started: wait, so the snapshot is not in use after we return. The write checks ctx
	// between blobs, so this is at most one blob's write.
	res := <-r.result
	return res.st, res.err
}

// Flush waits until every snapshot queued before the call is durable or superseded by a
// durable one, and returns the error of the last save handled (nil if it succeeded): an
// error from an earlier write that a later one made moot is not reported.
func (c *Checkpointer) Flush(ctx context.Context) error {
	q := &c.q
	q.mu.Lock()
	target := q.issued
	for q.done < target {
		ch := q.changed
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("flush checkpoint: %w", ctx.Err())
		}
		q.mu.Lock()
	}
	err := q.lastErr
	q.mu.Unlock()
	return err
}

// run is the writer goroutine.
func (c *Checkpointer) run() {
	q := &c.q
	defer close(q.stopped)
	for {
		r, ok := q.pop()
		if !ok {
			return
		}
		if r.skip {
			// Flush reports it: snapshots this Save superseded were not written either.
			r.snap.release()
			q.finish(r.ticket, fmt.Errorf("checkpoint round %d: abandoned: %w", r.snap.Round, r.ctx.Err()))
			continue
		}
		ctx := r.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		st, err := c.write(ctx, r.snap)
		switch {
		case err != nil && r.result == nil:
			c.log.Error("background checkpoint failed", "round", r.snap.Round, "err", err)
		case err == nil:
			c.log.Debug("checkpoint saved", "seq", st.Seq, "round", st.Round)
		}
		r.snap.release()
		r.snap = nil // the caller's buffers can be collected now
		q.finish(r.ticket, err)
		if r.result != nil {
			r.result <- result{st, err}
		}
	}
}

// pop waits for the next request; false once closed and drained.
func (q *queue) pop() (*request, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			r := q.items[0]
			q.items[0] = nil
			q.items = q.items[1:]
			r.started = true
			q.mu.Unlock()
			return r, true
		}
		if q.closed {
			q.mu.Unlock()
			return nil, false
		}
		q.mu.Unlock()
		<-q.wake
	}
}

// finish records the outcome of ticket; requests it superseded have smaller tickets.
func (q *queue) finish(ticket uint64, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.done = max(q.done, ticket)
	q.lastErr = err
	close(q.changed)
	q.changed = make(chan struct{})
}

// close stops new requests, lets the writer drain the queue, and returns the last
// write's error.
func (q *queue) close() error {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
	<-q.stopped
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.lastErr
}
