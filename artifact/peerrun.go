package artifact

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Why a holder left a download; peerOutcome maps them to metric labels.
var (
	errPeerGone    = errors.New("holder unreachable or stream failed")
	errPeerStalled = errors.New("holder stalled")
	errBadManifest = errors.New("holder sent a forged manifest")
	errProtocol    = errors.New("holder broke the protocol")
	errBadChunk    = errors.New("holder sent a corrupt chunk")
)

func peerOutcome(err error) string {
	var re *remoteError
	switch {
	case errors.Is(err, errBadChunk):
		return peerBadChunk
	case errors.Is(err, errBadManifest):
		return peerBadManifest
	case errors.Is(err, errProtocol):
		return peerProtocol
	case errors.Is(err, errPeerStalled):
		return peerStalled
	case errors.Is(err, errPeerLacks):
		return peerNotFound
	case errors.As(err, &re):
		return peerRefused
	default:
		return peerGone
	}
}

// classifyReadErr names a failed read: a stall if our watchdog reset the stream,
// otherwise a lost holder, or a protocol violation for malformed frames.
func classifyReadErr(err error, stalled bool) error {
	if stalled {
		return fmt.Errorf("%w: no data for the request timeout", errPeerStalled)
	}
	if errors.Is(err, errFrameTooLarge) || errors.Is(err, errMalformedFrame) {
		return fmt.Errorf("%w: %w", errProtocol, err)
	}
	return fmt.Errorf("%w: %w", errPeerGone, err)
}

// peerRun is one holder serving one download, over n sessions (reserveStreams).
type peerRun struct {
	d      *download
	p      peer.ID
	direct bool // asked only over a direct connection (a copy holder)
	n      int  // sessions, reserved with the exchange until run returns
	ctx    context.Context
	cancel context.CancelFunc

	penalised atomic.Bool  // set when first caught sending bad data, so it is penalised once
	nlacks    atomic.Int32 // len(lacks), read without the lock on every take
	chunks    atomic.Int64 // verified chunks it sent
	relayed   atomic.Bool  // a stream of it went through a relay

	mu    sync.Mutex
	err   error        // why the holder left (first failure wins)
	lacks map[int]bool // chunks a partial holder said it lacks
}

// copyStall bounds how long a copy holder may owe chunks without sending any: it is an
// extra source that anyone can claim to be, and the chunks it holds back delay the
// download until they go to others. An honest copy holder on a direct connection sends
// a 1 MiB chunk within it down to about 2 Mbit/s.
const copyStall = 5 * time.Second

// stallTimeout is how long a holder may owe chunks or a manifest without sending any
// (direct: a copy holder).
func (x *Exchange) stallTimeout(direct bool) time.Duration {
	if direct {
		return min(copyStall, x.opts.RequestTimeout)
	}
	return x.opts.RequestTimeout
}

// copyFailed passes over a copy holder that left a download with err for passOverFor:
// one that stalled, broke off or could not be reached directly. One that lacks the
// artifact (pruned) is asked again, a download that ended first says nothing of it, and
// neither does a dial that lost a race with another dial to it (isDialRace): the
// download asks it again after retryLeft. (A late joiner dials every trainer at once as
// it starts; passed over on that, the copies behind cone routers were never asked during
// its download of the model, which the validator alone then served.)
func (x *Exchange) copyFailed(p peer.ID, err error) {
	if !errors.Is(err, context.Canceled) && !errors.Is(err, errPeerLacks) && !isDialRace(err) {
		x.book.passOver(p, time.Now())
	}
}

func newPeerRun(d *download, c candidate) *peerRun {
	ctx, cancel := context.WithCancel(d.ctx)
	return &peerRun{d: d, p: c.p, direct: c.direct, n: d.x.reserveStreams(c.p), ctx: ctx, cancel: cancel}
}

func (pr *peerRun) run() {
	defer pr.d.x.releaseStreams(pr.p, pr.n)
	window := max(1, (pr.d.window+pr.n-1)/pr.n)
	var wg sync.WaitGroup
	for i := range pr.n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pr.session(window, i == 0); err != nil {
				pr.fail(err)
			}
		}()
	}
	wg.Wait()
	pr.cancel()
}

// fail ends the holder's part in the download; the first reason is kept, counted and,
// for bad data, penalised.
func (pr *peerRun) fail(err error) {
	outcome := peerOutcome(err)
	if outcome == peerBadChunk || outcome == peerBadManifest || outcome == peerProtocol {
		if !pr.penalised.Swap(true) {
			pr.d.penalise(pr.p, outcome, err)
		}
	}
	pr.mu.Lock()
	first := pr.err == nil
	if first {
		pr.err = err
	}
	pr.mu.Unlock()
	if first {
		if pr.direct {
			pr.d.x.copyFailed(pr.p, err)
		}
		// A holder that merely finished or whose context ended is not a failure.
		if !errors.Is(err, context.Canceled) {
			pr.d.x.m.peerDrops.WithLabelValues(outcome).Inc()
			pr.d.log.Debug("holder dropped", "peer", pr.p.String(), "outcome", outcome, "err", err)
		}
	}
	pr.cancel()
}

func (pr *peerRun) lacksChunk(i int) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.lacks[i]
}

func (pr *peerRun) markLacks(i int) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.lacks == nil {
		pr.lacks = make(map[int]bool)
	}
	pr.lacks[i] = true
	pr.nlacks.Store(int32(len(pr.lacks)))
}

func (pr *peerRun) hasLacks() bool { return pr.nlacks.Load() > 0 }

// forgetLacks lets a partial holder be asked again for chunks it lacked: it may have
// them by now.
func (pr *peerRun) forgetLacks() {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.lacks = nil
	pr.nlacks.Store(0)
}

// watchdog resets a stream when no progress is seen for a timeout. Stream deadlines
// alone would do on TCP and QUIC, but mocknet ignores them and a watchdog covers both.
type watchdog struct {
	timeout time.Duration
	t       *time.Timer
	did     atomic.Bool
}

func newWatchdog(timeout time.Duration, onStall func()) *watchdog {
	w := &watchdog{timeout: timeout}
	w.t = time.AfterFunc(time.Hour, func() {
		w.did.Store(true)
		onStall()
	})
	w.t.Stop()
	return w
}

// arm (re)starts the countdown.
func (w *watchdog) arm()        { w.t.Reset(w.timeout) }
func (w *watchdog) stop()       { w.t.Stop() }
func (w *watchdog) fired() bool { return w.did.Load() }
