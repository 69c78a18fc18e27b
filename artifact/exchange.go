package artifact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/internal/progress"
)

// ErrNoHolders is returned by Fetch when no reachable peer holds the artifact.
var ErrNoHolders = errors.New("no peer holds the artifact")

// ErrClosed is returned by Fetch after Close.
var ErrClosed = errors.New("artifact exchange closed")

// ErrTooLarge: the artifact's manifest gives a size above what the caller of FetchAtMost
// accepts.
var ErrTooLarge = errors.New("artifact larger than allowed")

// Defaults for ExchangeOptions.
const (
	DefaultStreamsPerPeer  = 2
	DefaultRequestTimeout  = 20 * time.Second
	DefaultMaxPeers        = 8
	DefaultPenaltyDuration = 10 * time.Minute
	// DefaultFrameDeadline bounds the arrival of a request frame once its first byte is in.
	DefaultFrameDeadline = 10 * time.Second
	// defaultWindowBytes sizes the default window: enough data in flight per holder to
	// keep a fast link busy while requests travel.
	defaultWindowBytes = 16 << 20
	maxDefaultWindow   = 1024
)

// ExchangeOptions configure an Exchange. Zero values select the defaults.
type ExchangeOptions struct {
	// Window is the number of chunk requests in flight per holder. The default holds
	// about 16 MiB in flight (16 chunks of 1 MiB), and at least 4 chunks.
	Window int
	// StreamsPerPeer is the number of streams opened to each holder (default 2); the
	// window is split between them.
	StreamsPerPeer int
	// MaxStreamsPerPeer is the most streams opened to a holder far away: one per 32 ms
	// of its round-trip time, at least StreamsPerPeer (default 8; streams.go).
	MaxStreamsPerPeer int
	// RequestTimeout bounds opening a stream and each wait for data: a holder that sends
	// nothing for this long while owing us chunks is dropped and its chunks go to others.
	RequestTimeout time.Duration
	// MaxPeers is the number of holders used at once for one fetch (default 8).
	MaxPeers int
	// PenaltyDuration is how long a peer that sent bad data is not asked again (default
	// 10 minutes).
	PenaltyDuration time.Duration
	// FrameDeadline is how long a holder waits for the rest of a request frame once its
	// first byte arrived (default 10 s): a peer that starts a request and stalls loses the
	// stream. Idle time between complete requests is bounded separately, and longer.
	FrameDeadline time.Duration
	Logger        *slog.Logger
	// Progress shows downloads as they go (nil: not shown); each is named by the first
	// caller's context (progress.WithName).
	Progress progress.Tracker
	// Registerer receives the p2ptrain_artifact_* metrics (default: a private registry).
	Registerer prometheus.Registerer
	// Relays are the peers that relay for others (the node's bootstrap peers): a holder
	// this node cannot dial is asked through them, where it keeps a reservation (circuit
	// relay v2; relayed.go). Empty: holders are dialled directly only.
	Relays []peer.AddrInfo

	// Idle stream timeouts, shortened by tests (per exchange, so that a test's streams
	// never see another test's settings).
	idleReopen time.Duration // fetcher: reopen a stream idle this long (default 30 s)
	holderIdle time.Duration // holder: drop a stream idle this long (default max(4 × RequestTimeout, 1 min))
}

func (o ExchangeOptions) withDefaults() ExchangeOptions {
	if o.StreamsPerPeer <= 0 {
		o.StreamsPerPeer = DefaultStreamsPerPeer
	}
	if o.MaxStreamsPerPeer <= 0 {
		o.MaxStreamsPerPeer = DefaultMaxStreamsPerPeer
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.MaxPeers <= 0 {
		o.MaxPeers = DefaultMaxPeers
	}
	if o.PenaltyDuration <= 0 {
		o.PenaltyDuration = DefaultPenaltyDuration
	}
	if o.FrameDeadline <= 0 {
		o.FrameDeadline = DefaultFrameDeadline
	}
	if o.idleReopen <= 0 {
		o.idleReopen = defaultIdleReopen
	}
	if o.holderIdle <= 0 {
		// Fetchers keep streams open while they wait for chunks to re-request, so a
		// holder waits well beyond the request timeout and the fetcher's idleReopen.
		o.holderIdle = max(4*o.RequestTimeout, time.Minute)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	return o
}

// window is the per-holder window for an artifact with the given chunk size.
func (o ExchangeOptions) window(chunkSize uint64) int {
	if o.Window > 0 {
		return o.Window
	}
	return int(min(max(defaultWindowBytes/chunkSize, 4), maxDefaultWindow))
}

// Exchange serves the artifacts of a store to peers and fetches artifacts from peers
// into it, over ProtocolID.
type Exchange struct {
	h     host.Host
	store *Store
	opts  ExchangeOptions
	log   *slog.Logger
	m     *metrics
	book  *holderBook

	ctx    context.Context // lives until Close
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	downloads map[cid.Cid]*download // running, with at least one caller
	stopping  map[cid.Cid]*download // abandoned by every caller, still releasing files
	serving   map[network.Stream]struct{}
	streams   map[peer.ID]int // streams our downloads hold to each holder (reserveStreams)
	wg        sync.WaitGroup  // downloads
}

// NewExchange creates an exchange for store on h and registers the stream handler.
func NewExchange(h host.Host, store *Store, opts ExchangeOptions) *Exchange {
	opts = opts.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	x := &Exchange{
		h:         h,
		store:     store,
		opts:      opts,
		log:       opts.Logger,
		m:         newMetrics(opts.Registerer),
		book:      newHolderBook(defaultHolderTTL),
		ctx:       ctx,
		cancel:    cancel,
		downloads: make(map[cid.Cid]*download),
		stopping:  make(map[cid.Cid]*download),
		serving:   make(map[network.Stream]struct{}),
		streams:   make(map[peer.ID]int),
	}
	h.SetStreamHandler(ProtocolID, x.handleStream)
	return x
}

// Close removes the stream handler, resets streams being served and stops downloads
// (their partial state stays on disk for a later Fetch). It waits for downloads to end.
func (x *Exchange) Close() error {
	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return nil
	}
	x.closed = true
	for s := range x.serving {
		s.Reset()
	}
	x.mu.Unlock()
	x.h.RemoveStreamHandler(ProtocolID)
	x.cancel()
	x.wg.Wait()
	return nil
}

// AddHolder records that p announced it holds id as its origin: the author of an update
// or a head. A running download of id starts using p if it has room for another holder.
// Where p can be reached only through a relay, the download asks it through the relay.
func (x *Exchange) AddHolder(id cid.Cid, p peer.ID) { x.addHolder(id, p, false) }

// AddCopy records that p announced it keeps a copy of id (a node announcing the
// parameters of the head it holds). A copy is an extra source, never the only one: it is
// asked only over a direct connection — dialled, or made by hole punching from a relayed
// one, which the download waits for — never through a relay, whose uplink would carry
// the bytes that the origin's holders can send themselves.
func (x *Exchange) AddCopy(id cid.Cid, p peer.ID) { x.addHolder(id, p, true) }

func (x *Exchange) addHolder(id cid.Cid, p peer.ID, copy bool) {
	if p == x.h.ID() || cids.Check(id, cids.CodecCBOR) != nil {
		return
	}
	x.book.add(id, p, time.Now(), copy)
	x.mu.Lock()
	d := x.downloads[id]
	x.mu.Unlock()
	if d != nil {
		d.notifyPeers()
	}
}

// Fetch downloads artifact id into the store, from the hinted peers, holders recorded by
// AddHolder, or, when none is known, the peers we are connected to. It returns nil at
// once if the store holds id. Concurrent calls for the same id share one download;
// when every caller has given up, the download stops and its partial state is kept, so
// the next Fetch resumes it.
func (x *Exchange) Fetch(ctx context.Context, id cid.Cid, hints ...peer.ID) error {
	return x.fetch(ctx, id, 0, hints)
}

// FetchAtMost is Fetch for an artifact of at most max bytes (0: any size). Once the
// manifest is known, a larger artifact is not downloaded for this caller, which gets
// ErrTooLarge: a peer that announces an update of the wrong size costs the manifest's
// round trip, not the bytes. (The download goes on while another caller still wants it.)
func (x *Exchange) FetchAtMost(ctx context.Context, id cid.Cid, max uint64, hints ...peer.ID) error {
	return x.fetch(ctx, id, max, hints)
}

func (x *Exchange) fetch(ctx context.Context, id cid.Cid, max uint64, hints []peer.ID) error {
	if err := cids.Check(id, cids.CodecCBOR); err != nil {
		x.m.fetches.WithLabelValues(fetchFailed).Inc()
		return fmt.Errorf("fetch artifact %s: %w", id, err)
	}
	if x.store.Has(id) {
		x.m.fetches.WithLabelValues(fetchPresent).Inc()
		return nil
	}
	d, err := x.join(id, hints, progress.Name(ctx, "fetching "+cids.Short(id.String())))
	if err != nil {
		return fmt.Errorf("fetch artifact %s: %w", id, err)
	}
	var sized <-chan struct{}
	if max > 0 {
		sized = d.sized
	}
	for {
		select {
		case <-d.done:
			if d.err == nil && max > 0 && d.size > max {
				// Done before this caller saw the size (another caller's download).
				return x.tooLarge(id, d.size, max)
			}
			x.m.fetches.WithLabelValues(fetchOutcome(d.err)).Inc()
			return d.err
		case <-sized:
			if d.size > max {
				x.leave(d)
				return x.tooLarge(id, d.size, max)
			}
			sized = nil
		case <-ctx.Done():
			x.leave(d)
			x.m.fetches.WithLabelValues(fetchCanceled).Inc()
			return fmt.Errorf("fetch artifact %s: %w", id, ctx.Err())
		}
	}
}

// tooLarge counts and reports a fetch refused for its size (FetchAtMost).
func (x *Exchange) tooLarge(id cid.Cid, size, max uint64) error {
	x.m.fetches.WithLabelValues(fetchFailed).Inc()
	return fmt.Errorf("fetch artifact %s: %w: %d bytes, at most %d", id, ErrTooLarge, size, max)
}

func fetchOutcome(err error) string {
	switch {
	case err == nil:
		return fetchOK
	case errors.Is(err, ErrNoHolders):
		return fetchNotFound
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fetchCanceled
	default:
		return fetchFailed
	}
}

// join attaches the caller to the running download of id, or starts one.
func (x *Exchange) join(id cid.Cid, hints []peer.ID, name string) (*download, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil, ErrClosed
	}
	if d := x.downloads[id]; d != nil && !d.isDone() {
		d.refs++
		d.addHints(hints)
		return d, nil
	}
	d := newDownload(x, id, hints, x.stopping[id])
	d.name = name
	x.downloads[id] = d
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		d.run()
		x.mu.Lock()
		if x.downloads[id] == d {
			delete(x.downloads, id)
		}
		if x.stopping[id] == d {
			delete(x.stopping, id)
		}
		x.mu.Unlock()
	}()
	return d, nil
}

// leave detaches a caller; the last one to leave stops the download.
func (x *Exchange) leave(d *download) {
	x.mu.Lock()
	defer x.mu.Unlock()
	d.refs--
	if d.refs > 0 {
		return
	}
	d.cancel()
	// A new Fetch starts a fresh download, which waits for this one to release the
	// partial files.
	if x.downloads[d.id] == d {
		delete(x.downloads, d.id)
		x.stopping[d.id] = d
	}
}

// activePartial returns the partial state of a running download of id, for serving
// its chunks to others.
func (x *Exchange) activePartial(id cid.Cid) *partial {
	x.mu.Lock()
	d := x.downloads[id]
	x.mu.Unlock()
	if d == nil {
		return nil
	}
	return d.part.Load()
}
