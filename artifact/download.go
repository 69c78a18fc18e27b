package artifact

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/internal/progress"
)

// Verified chunks wait for the disk in a queue of writeQueue chunks and at most
// writeBudget bytes, per download.
const (
	writeQueue  = 8
	writeBudget = 64 << 20
)

// retryLeft is how long a holder that left a download with an error (a broken stream, a
// restarted node) sits out before the download asks it again.
const retryLeft = 5 * time.Second

// download is one fetch of one artifact, shared by every Fetch call for it.
type download struct {
	x      *Exchange
	id     cid.Cid
	log    *slog.Logger
	name   string        // what the download is shown as (progress)
	task   progress.Task // set once the manifest is known
	prev   *download     // an abandoned download of the same id that must release its files first
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
	// sized is closed once the manifest is known; size is its size, set before.
	sized chan struct{}
	size  uint64

	refs int // callers waiting; guarded by x.mu

	mu      sync.Mutex
	hints   []peer.ID
	tried   map[peer.ID]peerTry // peers used (or asked) in this download, and how they left
	peersCh chan struct{}       // a new holder may be available

	// Set once the manifest is known.
	m       *Manifest
	pt      *partial
	part    atomic.Pointer[partial] // pt while chunks are being fetched, for serving them
	q       *chunkQueue
	window  int
	writeCh chan writeJob // verified chunks, to be written
	fatalCh chan error
	// servedBy is how many chunks each holder sent (see the function servedBy), set when
	// fetchChunks ends.
	servedBy string
}

func newDownload(x *Exchange, id cid.Cid, hints []peer.ID, prev *download) *download {
	ctx, cancel := context.WithCancel(x.ctx)
	d := &download{
		x: x, id: id, prev: prev, ctx: ctx, cancel: cancel,
		log:     x.log.With("artifact", id.String()),
		done:    make(chan struct{}),
		sized:   make(chan struct{}),
		refs:    1,
		tried:   make(map[peer.ID]peerTry),
		peersCh: make(chan struct{}, 1),
		fatalCh: make(chan error, 1),
	}
	d.addHints(hints)
	return d
}

func (d *download) isDone() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *download) addHints(hints []peer.ID) {
	if len(hints) == 0 {
		return
	}
	d.mu.Lock()
	for _, p := range hints {
		if !slices.Contains(d.hints, p) {
			d.hints = append(d.hints, p)
		}
	}
	d.mu.Unlock()
	d.notifyPeers()
}

func (d *download) notifyPeers() {
	select {
	case d.peersCh <- struct{}{}:
	default:
	}
}

// candidate is a peer nextCandidate picked: known when it came from the hints or
// announcements, direct when it is asked only over a direct connection (a copy holder,
// Exchange.AddCopy).
type candidate struct {
	p             peer.ID
	known, direct bool
}

// nextCandidate picks a peer not yet used in this download (nor in also): hints first,
// then announced holders (newest first), and, if local is set, the peers we are
// connected to. Callers allow the latter only when no known holder is at work, so
// strangers are asked only when the known holders are exhausted. A copy holder that
// failed a download lately is passed over (holderBook.passOver). The peer is marked used
// in also, or in the download if also is nil.
func (d *download) nextCandidate(also map[peer.ID]bool, local bool) (candidate, bool) {
	now := time.Now()
	self := d.x.h.ID()
	usable := func(p peer.ID) bool {
		// A peer that left with an error (its node restarted, a stream broke) is asked
		// again once retryLeft has passed: otherwise a download whose only other holders
		// are partial ones lacking the same chunks waits on them for ever.
		try, used := d.tried[p]
		again := used && try.err != nil && now.Sub(try.leftAt) >= retryLeft
		return (!used || again) && !also[p] && p != self && p != "" && !d.x.book.isPenalised(p, now)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	pick := func(c candidate) (candidate, bool) {
		if also != nil {
			also[c.p] = true
		} else {
			d.tried[c.p] = peerTry{}
		}
		return c, true
	}
	for _, p := range d.hints {
		if usable(p) {
			return pick(candidate{p: p, known: true})
		}
	}
	for _, h := range d.x.book.get(d.id, now) {
		if usable(h.p) && !(h.copy && d.x.book.isPassedOver(h.p, now)) {
			return pick(candidate{p: h.p, known: true, direct: h.copy})
		}
	}
	if local {
		for _, p := range d.x.h.Network().Peers() {
			if usable(p) {
				return pick(candidate{p: p})
			}
		}
	}
	return candidate{}, false
}

// peerLeft records why p stopped serving this download.
func (d *download) peerLeft(p peer.ID, err error) {
	d.mu.Lock()
	d.tried[p] = peerTry{err: err, leftAt: time.Now()}
	d.mu.Unlock()
}

// peerTry is how a peer used in a download left it: err nil while it serves or after it
// finished cleanly; leftAt matters only with an error (see retryLeft).
type peerTry struct {
	err    error
	leftAt time.Time
}

// peerErrors summarises why every peer tried failed, for the final error.
func (d *download) peerErrors() (errs []error, notFound int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for p, try := range d.tried {
		switch err := try.err; {
		case err == nil:
		case errors.Is(err, errPeerLacks):
			notFound++
		default:
			errs = append(errs, fmt.Errorf("peer %s: %w", p, err))
		}
	}
	return errs, notFound
}

func (d *download) run() {
	defer close(d.done)
	defer d.cancel()
	if d.prev != nil {
		select {
		case <-d.prev.done:
		case <-d.ctx.Done():
			d.err = fmt.Errorf("fetch artifact %s: %w", d.id, d.ctx.Err())
			return
		}
	}
	start := time.Now()
	err := d.fetch()
	if d.task != nil {
		d.task.Finish(err)
	}
	if err != nil {
		if d.x.ctx.Err() != nil {
			err = ErrClosed
		}
		d.err = fmt.Errorf("fetch artifact %s: %w", d.id, err)
		d.log.Debug("fetch failed", "err", err)
		return
	}
	d.x.m.fetchDuration.Observe(time.Since(start).Seconds())
}

func (d *download) fetch() error {
	if d.x.store.Has(d.id) {
		return nil
	}
	mb, m, ok := d.x.store.loadPartialManifest(d.id)
	if !ok {
		var err error
		if mb, m, err = d.fetchManifest(); err != nil {
			return err
		}
	}
	part, resumed, err := d.x.store.openPartial(d.id, mb, m)
	if err != nil {
		return err
	}
	if resumed > 0 {
		d.x.m.bytesResumed.Add(float64(resumed))
		d.log.Info("resuming download", "have_bytes", resumed, "size", m.Size)
	}
	d.m = m
	d.size = m.Size
	close(d.sized)
	d.task = progress.Start(d.x.opts.Progress, d.name, progress.InBytes, m.Size, uint64(resumed))
	d.pt = part
	d.window = d.x.opts.window(m.ChunkSize)
	d.q = newChunkQueue(len(m.Chunks), part.has)
	d.part.Store(part)
	started := time.Now()
	if d.q.left() == 0 {
		// Resumed complete (or empty): nothing to ask anyone for.
	} else if err := d.fetchChunks(); err != nil {
		d.part.Store(nil)
		if cerr := part.close(); cerr != nil {
			d.log.Warn("keeping partial state failed", "err", cerr)
		}
		return err
	}
	d.part.Store(nil)
	transferred := time.Now()
	if err := part.finish(); err != nil {
		return err
	}
	d.x.book.forget(d.id)
	d.log.Debug("fetched", "size", m.Size, "chunks", len(m.Chunks), "chunks_from", d.servedBy,
		"transfer", transferred.Sub(started), "install", time.Since(transferred))
	return nil
}

// fetchChunks runs holders and the writer until every chunk is written, the context
// ends, or no holder is left.
func (d *download) fetchChunks() error {
	// Sessions verify each chunk as it arrives; one writer puts the verified chunks on
	// disk. Several O_DIRECT writers made fetches slower, not faster: concurrent writes
	// into a sparse file contend for its allocation and reach the disk out of order,
	// while one sequential writer keeps up with the device. The queue holds at most
	// writeBudget bytes of chunks, and at least one.
	d.writeCh = make(chan writeJob, max(1, min(writeQueue, writeBudget/int(d.m.ChunkSize))))
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for j := range d.writeCh {
			d.write(j)
		}
	}()
	var holders sync.WaitGroup
	var runs []*peerRun // every holder asked, for servedBy
	defer func() { d.servedBy = servedBy(runs) }()
	active := make(map[peer.ID]*peerRun)
	knownActive := 0
	isKnown := make(map[peer.ID]bool)
	exits := make(chan *peerRun)
	// Holders that left with an error may be asked again (nextCandidate): look for them
	// every retryLeft while the download goes on.
	retry := time.NewTicker(retryLeft)
	defer retry.Stop()
	stop := func() {
		for _, pr := range active {
			pr.cancel()
		}
		// Drain exits so every holder goroutine can finish; then no session sends
		// to the writer, which finishes what is queued.
		go func() {
			holders.Wait()
			close(exits)
		}()
		for range exits {
		}
		close(d.writeCh)
		<-writing
	}
	for {
		for len(active) < d.x.opts.MaxPeers {
			c, ok := d.nextCandidate(nil, knownActive == 0)
			if !ok {
				break
			}
			if c.known {
				knownActive++
				isKnown[c.p] = true
			}
			pr := newPeerRun(d, c)
			runs = append(runs, pr)
			active[c.p] = pr
			holders.Add(1)
			// Counted before the sessions start so the first one to ask for work does not
			// take the others' share.
			d.q.addSessions(pr.n)
			go func() {
				defer holders.Done()
				pr.run()
				d.q.addSessions(-pr.n)
				exits <- pr
			}()
		}
		if len(active) == 0 && d.q.left() > 0 {
			stop()
			return d.noHoldersLeft()
		}
		select {
		case <-d.q.complete:
			stop()
			return nil
		case pr := <-exits:
			delete(active, pr.p)
			if isKnown[pr.p] {
				knownActive--
			}
			d.peerLeft(pr.p, pr.err)
		case <-d.peersCh:
		case <-retry.C:
		case err := <-d.fatalCh:
			stop()
			return err
		case <-d.ctx.Done():
			stop()
			return d.ctx.Err()
		}
	}
}

// servedBy says how many chunks each holder sent ("PEER:N", most first), marking a
// holder reached through a relay: what the download's debug line shows.
func servedBy(runs []*peerRun) string {
	type served struct {
		p       peer.ID
		n       int64
		relayed bool
	}
	var by []served
	for _, pr := range runs {
		i := slices.IndexFunc(by, func(s served) bool { return s.p == pr.p })
		if i < 0 {
			by, i = append(by, served{p: pr.p}), len(by)
		}
		by[i].n += pr.chunks.Load()
		by[i].relayed = by[i].relayed || pr.relayed.Load()
	}
	slices.SortStableFunc(by, func(a, b served) int { return cmp.Compare(b.n, a.n) })
	parts := make([]string, 0, len(by))
	for _, s := range by {
		part := fmt.Sprintf("%s:%d", s.p, s.n)
		if s.relayed {
			part += " relayed"
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ",")
}

func (d *download) noHoldersLeft() error {
	errs, notFound := d.peerErrors()
	left := d.q.left()
	if len(errs) == 0 {
		return fmt.Errorf("%w (%d peers asked lack it; %d of %d chunks missing)", ErrNoHolders, notFound, left, len(d.m.Chunks))
	}
	return fmt.Errorf("no holder could serve the last %d of %d chunks: %w", left, len(d.m.Chunks), errors.Join(errs...))
}

// writeJob is a verified chunk waiting to be written.
type writeJob struct {
	index int
	buf   *[]byte
	n     int
}

// write puts a verified chunk at its offset. A failed write ends the download: the
// disk, not a holder, is at fault.
func (d *download) write(j writeJob) {
	defer buffers.put(j.buf)
	if err := d.pt.writeChunk(j.index, (*j.buf)[:j.n]); err != nil {
		d.q.giveBack(j.index)
		select {
		case d.fatalCh <- err:
		default:
		}
		return
	}
	d.task.Add(uint64(j.n))
	d.q.done(j.index)
}

// penalise remembers a peer that sent bad data so no fetch asks it for a while.
func (d *download) penalise(p peer.ID, outcome string, err error) {
	d.x.book.penalise(p, time.Now(), d.x.opts.PenaltyDuration)
	d.log.Warn("peer penalised", "peer", p.String(), "outcome", outcome, "err", err)
}
