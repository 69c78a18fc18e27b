package trainer

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
)

// Window trains one leased window and stores its pseudo-gradient: the node's
// round.Trainer, or a test build's decoration of it.
type Window interface {
	Train(ctx context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*round.Result, error)
}

// Chain is what the trainer reads of the chain: the canonical head, a signal when it
// changes, and any stored head by CID.
type Chain interface {
	Current() (cid.Cid, *chain.Head)
	// Changed is closed at the next change of the canonical head.
	Changed() <-chan struct{}
	Head(id cid.Cid) (*chain.Head, error)
}

// Held is the lease a trainer is working on.
type Held struct {
	Round       uint64
	Lease       cid.Cid
	Microshards []uint32
	Expiry      time.Time
}

// Trained is what one window produced, as the trainer announced it.
type Trained struct {
	Round        uint64
	Delta        cid.Cid
	Samples      uint64
	Loss         float64
	Seconds      float64 // the window end to end
	TrainSeconds float64 // the worker's training alone
	OptState     string  // path of the inner optimizer's state after the window ("" = none)
	// Window says how it was trained under protocol.overlap: eager (ahead.go); its zero
	// value without overlap.
	Window WindowKind
}

// WindowKind is how a window was trained under protocol.overlap: eager.
type WindowKind struct {
	Overlap bool // the trainer trains ahead
	Ahead   bool // trained ahead of its lease, not from its base after the lease came
	// MovedAt is the step before which a window trained ahead was moved onto its head, or
	// −1: it had finished before the head came, and its update is measured from its start.
	MovedAt int
	Steps   int
}

// Sink receives what the trainer does, for the node's status, metrics and checkpoints.
type Sink interface {
	// Holding reports the lease being trained; nil when the window is over.
	Holding(l *Held)
	// Trained reports a window trained, before its contribution is published.
	Trained(t Trained)
	// Event records something a user should see on the status page.
	Event(kind, format string, args ...any)
}

// Params is what the trainer role uses.
type Params struct {
	Experiment string
	Seed       int64  // the experiment's seed; each window's is drawn from it (see Seed)
	InnerSteps int    // steps of a lease that names none
	Rounds     int    // the experiment's last round; 0 = no limit
	Self       string // this node's peer ID
	// IsValidator says whether a peer is a configured validator: only those grant leases.
	IsValidator func(peer string) bool
	Bus         bus.Bus
	// Inbox, when set, is the subscription to Bus that Run reads (and closes), made before
	// the node first announced itself: a leader grants a trainer it hears start within
	// milliseconds, and a grant published before Run subscribed would be lost. Without it
	// Run subscribes itself.
	Inbox    *bus.Inbox
	Chain    Chain
	Work     Window
	Capacity *Capacity // measured here, announced by the node
	// Room, when set, says why this node cannot store what a lease needs now (its base
	// head and parameters, its update: a full disk), nil when it can. A lease taken while
	// it cannot is given back at once with that reason, not waited out by the leader.
	Room func() error
	// Eager, when set (protocol.overlap: eager), trains the reservations leases carry
	// ahead of their lease (ahead.go).
	Eager Eager
	Sink  Sink
	Log   *slog.Logger
}

// Trainer is the trainer role's loop.
type Trainer struct {
	Params
	ahead *aheadWindow // a window training or trained ahead of its lease (Run's goroutine only)
	// updates are the trainers' updates heard on the bus, under overlap (updates.go).
	updates *updates
}

// New returns the trainer role; Run runs it.
func New(p Params) *Trainer {
	if p.Capacity == nil {
		p.Capacity = &Capacity{}
	}
	return &Trainer{Params: p}
}

// baseWait is how long a lease waits for its base head to become canonical here.
const baseWait = 10 * time.Second

// Run trains the leases granted to this node, one at a time, until ctx ends. A lease that
// fails is logged, reported to the sink and given back; Run itself fails only with ctx.
func (t *Trainer) Run(ctx context.Context) error {
	in := t.Inbox
	if in == nil {
		in = t.Bus.Subscribe()
	}
	defer in.Close()
	if t.Eager != nil {
		t.updates = newUpdates()
		hctx, stop := context.WithCancel(ctx)
		heard := make(chan struct{})
		go func() {
			defer close(heard)
			t.updates.hear(hctx, in.Contributions, func() uint64 {
				if _, h := t.Chain.Current(); h != nil {
					return h.Round
				}
				return 0
			})
		}()
		defer func() { stop(); <-heard }()
	}
	defer func() {
		if t.ahead != nil {
			t.dropAhead(t.ahead, "the run ended")
		}
	}()
	for {
		t.dropStaleAhead()
		if t.done() { // the node's watcher ends the run once it has recorded the last head
			<-ctx.Done()
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.Chain.Changed():
		case l := <-in.Leases:
			if err := t.onLeases(ctx, l.From, l.Msg); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if errors.Is(err, errStaleLease) {
					// The round closed before this node took the lease (a late joiner
					// hears leases of rounds it has already followed past): nothing to do.
					t.Log.Debug("lease skipped", "round", l.Msg.Round, "err", err)
					continue
				}
				t.Log.Error("lease failed", "round", l.Msg.Round, "err", err)
				t.Sink.Event("train", "round %d: %v", l.Msg.Round, err)
			}
		}
	}
}

// done reports whether the experiment's round limit is reached.
func (t *Trainer) done() bool {
	_, h := t.Chain.Current()
	return h != nil && config.RoundLimitReached(t.Rounds, h.Round)
}

func (t *Trainer) onLeases(ctx context.Context, from string, m *gossip.Leases) (err error) {
	if !t.IsValidator(from) || m.Issuer != from {
		return nil // only configured validators grant leases
	}
	var mine *int
	for i := range m.Leases {
		if m.Leases[i].Trainer == t.Self {
			mine = &i
			break
		}
	}
	if mine == nil {
		return nil
	}
	l := m.Leases[*mine]
	if time.Now().UnixMilli() > l.Expiry {
		return nil // expired while queued
	}
	// A lease this trainer cannot finish is given back at once, so the round's leader
	// returns its microshards to the pool instead of waiting out the deadline.
	defer func() {
		if err != nil && ctx.Err() == nil && time.Now().UnixMilli() <= l.Expiry {
			t.release(ctx, l, err)
		}
	}()
	if t.Room != nil {
		if err := t.Room(); err != nil {
			return fmt.Errorf("cannot store what the lease of round %d needs: %w", l.Round, err)
		}
	}
	baseID, err := cid.Cast(l.Base)
	if err != nil {
		return err
	}
	base, err := t.baseHead(ctx, baseID)
	if err != nil {
		return fmt.Errorf("lease on head %s: %w", baseID, err)
	}
	if err := l.Check(baseID, base); err != nil {
		return err
	}
	leaseID := l.ID()
	t.Sink.Holding(&Held{Round: l.Round, Lease: leaseID, Microshards: l.Microshards, Expiry: time.UnixMilli(l.Expiry)})
	defer t.Sink.Holding(nil)
	paramsID, err := base.ParamsID()
	if err != nil {
		return err
	}
	fetchStart := time.Now()
	if err := t.Bus.Fetch(ctx, paramsID); err != nil {
		return fmt.Errorf("fetch params %s of round %d: %w", paramsID, base.Round, err)
	}
	fetched := time.Since(fetchStart)
	wctx, cancel := context.WithDeadline(ctx, time.UnixMilli(l.Expiry))
	defer cancel()
	steps := int(l.Steps)
	if steps == 0 {
		steps = t.InnerSteps
	}
	seed := Seed(t.Seed, l.Round, m.Attempt, t.Self)
	var res *round.Result
	var w *round.Window // the window, kept past its update under overlap (ahead.go)
	var kind WindowKind
	trainStart := time.Now()
	if t.Eager != nil {
		kind = WindowKind{Overlap: true, Steps: steps}
		w, kind.Ahead, err = t.eagerWindow(ctx, wctx, base, l, steps, seed)
		if err == nil {
			defer w.Close()
			res, err = w.Encode()
			if kind.Ahead {
				kind.MovedAt = w.MovedAt()
			}
		}
	} else {
		res, err = t.Work.Train(wctx, base, l.Microshards, steps, seed)
	}
	if err != nil {
		if errors.Is(wctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return fmt.Errorf("lease for round %d expired before training finished (%d steps, %s in; a window slower than the validators' lease.round_timeout never finishes): %w",
				l.Round, steps, time.Since(trainStart).Round(time.Second), err)
		}
		return err
	}
	t.Capacity.Observe(float64(res.Samples), res.TrainSeconds)
	t.Capacity.ObserveWindow(res.Steps, res.Seconds)
	c := &gossip.Contribution{Experiment: t.Experiment, Round: l.Round, Base: l.Base, Lease: leaseID.Bytes(),
		Peer: t.Self, Delta: res.Delta.Bytes(), Samples: res.Samples, Loss: res.Loss, Microshards: l.Microshards, Seconds: res.Seconds,
		TrainSeconds: res.TrainSeconds, FetchSeconds: fetched.Seconds() + res.FetchSeconds}
	t.Sink.Trained(Trained{Round: l.Round, Delta: res.Delta, Samples: res.Samples, Loss: res.Loss, Seconds: res.Seconds,
		TrainSeconds: res.TrainSeconds, OptState: res.OptState, Window: kind})
	t.Log.Info("trained", "round", l.Round, "microshards", len(l.Microshards), "samples", res.Samples, "loss", res.Loss, "seconds", fmt.Sprintf("%.2f", res.Seconds),
		"train_seconds", fmt.Sprintf("%.3f", res.TrainSeconds),
		"fetch_params_seconds", fmt.Sprintf("%.3f", fetched.Seconds()), "fetch_shards_seconds", fmt.Sprintf("%.3f", res.FetchSeconds),
		"steps", res.Steps, "delta_norm", fmt.Sprintf("%.4g", res.DeltaNorm), "residual_norm", fmt.Sprintf("%.4g", res.ResidualNorm))
	if err := t.Bus.Publish(ctx, c); err != nil {
		return err
	}
	if w != nil {
		var peers []string // the trainers whose updates the window ahead waits for
		for _, o := range m.Leases {
			if o.Trainer != t.Self {
				peers = append(peers, o.Trainer)
			}
		}
		t.startAhead(ctx, w, base, l, peers)
	}
	return nil
}

// release tells the round's leader that this trainer gives lease l back because of cause.
func (t *Trainer) release(ctx context.Context, l lease.Lease, cause error) {
	reason := cause.Error()
	if len(reason) > gossip.MaxReleaseReason {
		reason = strings.ToValidUTF8(reason[:gossip.MaxReleaseReason], "")
	}
	msg := &gossip.Release{Experiment: t.Experiment, Round: l.Round, Base: l.Base, Lease: l.ID().Bytes(), Peer: t.Self, Reason: reason}
	if err := t.Bus.Publish(ctx, msg); err != nil {
		t.Log.Warn("release lease", "round", l.Round, "err", err)
		return
	}
	t.Log.Info("released lease", "round", l.Round, "microshards", len(l.Microshards), "reason", reason)
}

// errStaleLease is a lease on a head older than this node's canonical head: its round is
// over.
var errStaleLease = errors.New("stale lease")

// baseHead returns the lease's base head, which must be (or become shortly) this node's
// canonical head: leases on a head we have not accepted are not trained.
func (t *Trainer) baseHead(ctx context.Context, id cid.Cid) (*chain.Head, error) {
	deadline := time.NewTimer(baseWait)
	defer deadline.Stop()
	for {
		// Watch for a change before looking: a head that becomes canonical between the look
		// and the wait would otherwise go unnoticed until the next one (a round later, or
		// never), and the lease would wait out baseWait.
		changed := t.Chain.Changed()
		cur, h := t.Chain.Current()
		if cur.Equals(id) {
			return h, nil
		}
		if h != nil {
			if bh, err := t.Chain.Head(id); err == nil && bh.Round < h.Round {
				return nil, fmt.Errorf("%w: base round %d, canonical round %d", errStaleLease, bh.Round, h.Round)
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-deadline.C:
			return nil, fmt.Errorf("base head is not canonical here: %w", chain.ErrNotFound)
		}
	}
}

// Seed is the worker's seed for a window: a function of the experiment's seed, the round,
// the lease attempt and the trainer's peer ID, so a rerun draws the same batches while the
// trainers of one round draw different ones (with one seed for all, every trainer took its
// batches at the same offsets of its shards, in the same order).
func Seed(experiment int64, round, attempt uint64, peer string) int64 {
	h := sha256.New()
	var b [24]byte
	binary.BigEndian.PutUint64(b[0:], uint64(experiment))
	binary.BigEndian.PutUint64(b[8:], round)
	binary.BigEndian.PutUint64(b[16:], attempt)
	h.Write(b[:])
	h.Write([]byte(peer))
	// 63 bits: torch.manual_seed takes any int64, and a non-negative seed reads the same in logs.
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]) >> 1)
}
