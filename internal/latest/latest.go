// Package latest owns the one background writer that keeps only the newest value waiting:
// a submission never blocks, and one that arrives while another waits replaces it, so a
// slow disk costs writes, never the caller's time or memory. checkpoint and export share it.
package latest

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

var (
	// ErrClosed is returned by Submit and Do after Close, and by Flush when the writer
	// stopped before everything asked of it was handled.
	ErrClosed = errors.New("writer closed")
	// ErrSuperseded is the reason Drop gets for a value a newer one replaced.
	ErrSuperseded = errors.New("superseded by a newer value")
	// ErrAbandoned wraps the context error of a Do whose caller gave up before its write
	// started.
	ErrAbandoned = errors.New("abandoned")
)

// Options configure a Writer. Write is required.
type Options[T, R any] struct {
	// Write writes one value; the writer calls it from its goroutine, one value at a time,
	// in the order the values were asked for. ctx ends when Close gives up waiting (and,
	// for Do, when its caller's context ends).
	Write func(ctx context.Context, v T) (R, error)
	// Drop, if set, releases a value that is not written: why is ErrSuperseded,
	// ErrClosed (submitted after Close), or the error recorded for an abandoned Do or for
	// a value left over when Close gave up.
	Drop func(v T, why error)
	// Name, if set, names a value in the errors the writer makes itself ("checkpoint
	// round 5"), so they read like the errors Write returns.
	Name func(v T) string
	// What names the values together in Flush's context error ("flush checkpoint: ...").
	What string
}

// Writer runs Write on values in a goroutine of its own. Values from Submit wait in one
// slot at the tail of the queue (latest wins); values from Do wait in line and are never
// replaced. It is safe for concurrent use.
type Writer[T, R any] struct {
	o Options[T, R]

	mu      sync.Mutex
	items   []*item[T, R] // not yet started; at most one Submit value, at the tail
	issued  uint64        // last ticket handed out
	done    uint64        // every ticket ≤ done is written, failed, dropped or superseded
	lastErr error         // result of the last value handled
	changed chan struct{} // closed (and replaced) whenever done moves
	closed  bool

	wake    chan struct{} // tells the goroutine there is work; capacity 1
	ctx     context.Context
	cancel  context.CancelFunc
	stopped chan struct{} // closed when the goroutine exits
}

// item is one value waiting. Tickets number values in the order they were asked for; a
// value's ticket is done once it is handled, and so is every smaller one.
type item[T, R any] struct {
	v      T
	ticket uint64
	ctx    context.Context // nil for Submit
	result chan result[R]  // nil for Submit; buffered
	// started is set when the goroutine takes the item, skip when its Do gave up before
	// that. Both guarded by Writer.mu.
	started, skip bool
}

type result[R any] struct {
	r   R
	err error
}

// New starts a writer. Close stops it.
func New[T, R any](o Options[T, R]) *Writer[T, R] {
	if o.Write == nil {
		panic("latest.New: no Write function") // a programming error, caught by any test
	}
	w := &Writer[T, R]{
		o:       o,
		changed: make(chan struct{}),
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	go w.run()
	return w
}

func (w *Writer[T, R]) signal() {
	select {
	case w.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
}

func (w *Writer[T, R]) drop(v T, why error) {
	if w.o.Drop != nil {
		w.o.Drop(v, why)
	}
}

func (w *Writer[T, R]) named(v T, err error) error {
	if w.o.Name == nil {
		return err
	}
	return fmt.Errorf("%s: %w", w.o.Name(v), err)
}

// Submit queues v and returns at once. A value submitted earlier and not yet started is
// dropped in favour of v. After Close, v is dropped and Submit returns ErrClosed. Errors
// of the write are reported by Flush and Close.
func (w *Writer[T, R]) Submit(v T) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		w.drop(v, ErrClosed)
		return ErrClosed
	}
	w.issued++
	it := &item[T, R]{v: v, ticket: w.issued}
	var old *item[T, R]
	if n := len(w.items); n > 0 && w.items[n-1].result == nil {
		old = w.items[n-1]
		w.items[n-1] = it
	} else {
		w.items = append(w.items, it)
	}
	w.mu.Unlock()
	if old != nil {
		w.drop(old.v, ErrSuperseded)
	}
	w.signal()
	return nil
}

// Do writes v and returns Write's result. Values from Submit not yet started are older
// than v and are dropped in its favour (even if this write then fails). The writer does
// not use v after Do returns. If ctx ends before the write starts, v is dropped and
// ctx's error returned (named); once started, Do waits for the write, which gets ctx.
// After Close, v is dropped and Do returns ErrClosed as is.
func (w *Writer[T, R]) Do(ctx context.Context, v T) (R, error) {
	it := &item[T, R]{v: v, ctx: ctx, result: make(chan result[R], 1)}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		w.drop(v, ErrClosed)
		var zero R
		return zero, ErrClosed
	}
	w.issued++
	it.ticket = w.issued
	kept := w.items[:0]
	var dropped []T
	for _, q := range w.items {
		if q.result != nil { // another caller's Do: it waits for its own answer
			kept = append(kept, q)
		} else {
			dropped = append(dropped, q.v)
		}
	}
	clear(w.items[len(kept):])
	w.items = append(kept, it)
	w.mu.Unlock()
	for _, d := range dropped {
		w.drop(d, ErrSuperseded)
	}
	w.signal()

	select {
	case res := <-it.result:
		return res.r, res.err
	case <-ctx.Done():
	}
	w.mu.Lock()
	if !it.started {
		it.skip = true
		w.mu.Unlock()
		var zero R
		return zero, w.named(v, ctx.Err())
	}
	w.mu.Unlock()
	// Started: wait, so v is not in use after we return. Write has ctx, so it stops soon.
	res := <-it.result
	return res.r, res.err
}

// Waiting is the number of values not yet started.
func (w *Writer[T, R]) Waiting() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.items)
}

// Flush waits until every value asked for before the call is handled or superseded, and
// returns the error of the last value handled (nil if it was written): an error from an
// earlier write that a later one made moot is not reported.
func (w *Writer[T, R]) Flush(ctx context.Context) error {
	w.mu.Lock()
	target := w.issued
	for w.done < target {
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-w.stopped:
			w.mu.Lock()
			if w.done < target {
				w.mu.Unlock()
				return ErrClosed
			}
			continue
		case <-ctx.Done():
			return fmt.Errorf("flush %s: %w", w.o.What, ctx.Err())
		}
		w.mu.Lock()
	}
	err := w.lastErr
	w.mu.Unlock()
	return err
}

// Close stops taking values and writes those waiting, unless ctx ends first: then the
// write in progress gets a cancelled context and the values still waiting are dropped.
// It returns the last value's error, like Flush. Calling it again is harmless.
func (w *Writer[T, R]) Close(ctx context.Context) error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.signal()
	select {
	case <-w.stopped:
	case <-ctx.Done():
		w.cancel()
		<-w.stopped
	}
	w.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

func (w *Writer[T, R]) run() {
	defer close(w.stopped)
	for {
		it, ok := w.pop()
		if !ok {
			return
		}
		var res result[R]
		switch {
		case it.skip:
			// Flush reports it: values this Do superseded were not written either.
			res.err = w.named(it.v, fmt.Errorf("%w: %w", ErrAbandoned, it.ctx.Err()))
			w.drop(it.v, res.err)
		case w.ctx.Err() != nil: // Close gave up waiting
			res.err = w.named(it.v, w.ctx.Err())
			w.drop(it.v, res.err)
		default:
			res = w.write(it)
		}
		var zero T
		it.v = zero // the caller's buffers can be collected now
		w.finish(it.ticket, res.err)
		if it.result != nil {
			it.result <- res
		}
	}
}

func (w *Writer[T, R]) write(it *item[T, R]) result[R] {
	ctx := w.ctx
	if it.ctx != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(it.ctx)
		defer cancel()
		defer context.AfterFunc(w.ctx, cancel)()
	}
	r, err := w.o.Write(ctx, it.v)
	return result[R]{r, err}
}

// pop waits for the next value; false once closed and drained.
func (w *Writer[T, R]) pop() (*item[T, R], bool) {
	for {
		w.mu.Lock()
		if len(w.items) > 0 {
			it := w.items[0]
			w.items[0] = nil
			w.items = w.items[1:]
			it.started = true
			w.mu.Unlock()
			return it, true
		}
		if w.closed {
			w.mu.Unlock()
			return nil, false
		}
		w.mu.Unlock()
		<-w.wake
	}
}

// finish records the outcome of ticket; values it superseded have smaller tickets.
func (w *Writer[T, R]) finish(ticket uint64, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = max(w.done, ticket)
	w.lastErr = err
	close(w.changed)
	w.changed = make(chan struct{})
}
