package pyruntime

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// backend is what Worker and Command share: their options, the slot one call (or a
// restart, or Close) holds at a time, a life context whose end interrupts a running call,
// the scratch directory, and the lifecycle: Start runs once, Close once, and each says what
// happened in the call bookkeeping.
type backend struct {
	opts    Options
	log     *slog.Logger
	what    string        // the backend in errors: "worker", "checkpoint command"
	sem     chan struct{} // held by the running call, a restart or Close
	life    context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // goroutines that live as long as the backend (the worker's restarts)
	pkgDir  string
	scratch string
	ownDir  bool

	mu      sync.Mutex // guards the fields below, and those of Worker and Command that say so
	state   State
	started bool
	closed  bool
	callLog
}

func newBackend(o Options, log *slog.Logger, what string) backend {
	life, cancel := context.WithCancel(context.Background())
	return backend{opts: o, log: log, what: what, sem: make(chan struct{}, 1), life: life, cancel: cancel, state: StateNew}
}

// start runs run once, as the backend's Start: a second Start, or one after Close, is an
// error, and a failed run leaves the backend failed with the error recorded. A run that
// returns without error leaves it ready (or as a call that began since has made it).
func (b *backend) start(ctx context.Context, run func(context.Context) (Info, error)) (Info, error) {
	b.mu.Lock()
	if b.started || b.closed {
		b.mu.Unlock()
		return Info{}, fmt.Errorf("pyruntime: start %s: already started or closed", b.what)
	}
	b.started = true
	b.state = StateStarting
	b.mu.Unlock()

	info, err := run(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.state = StateFailed
		b.fail(err)
		return Info{}, err
	}
	if b.state == StateStarting {
		b.state = StateReady
	}
	return info, nil
}

// prepare resolves the p2ptrain package and makes the scratch directory, first sweeping
// the scratch directories that dead nodes left in the usual places and in extra.
func (b *backend) prepare(ctx context.Context, extra ...string) (p2ptrainSource, error) {
	src, err := resolvePackage(ctx, b.opts)
	if err != nil {
		return p2ptrainSource{}, err
	}
	b.pkgDir = src.Dir
	sweepScratchDirs(b.log, append(scratchBases(), extra...)...)
	if b.scratch, b.ownDir, err = makeScratch(b.opts.ScratchDir); err != nil {
		return p2ptrainSource{}, err
	}
	return src, nil
}

// acquire takes the call slot, waiting at most until ctx ends or the backend closes.
func (b *backend) acquire(ctx context.Context) error {
	select {
	case b.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-b.life.Done():
		return ErrClosed
	}
}

func (b *backend) release() { <-b.sem }

// ScratchDir is the directory for the packs (and job manifests) exchanged with Python.
func (b *backend) ScratchDir() string { return b.scratch }

// close runs Close once: it ends the life context (a running call is interrupted), takes
// the call slot and runs stop in it (nil: nothing to stop), waits for the backend's
// goroutines, and removes the scratch directory if the backend made it.
func (b *backend) close(stop func()) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()

	b.cancel()
	b.sem <- struct{}{}
	if stop != nil {
		stop()
	}
	b.release()
	b.wg.Wait()
	b.mu.Lock()
	b.state = StateClosed
	b.mu.Unlock()
	if b.ownDir && b.scratch != "" {
		if err := removeScratch(b.scratch); err != nil {
			return fmt.Errorf("pyruntime: close: remove scratch dir: %w", err)
		}
	}
	return nil
}
