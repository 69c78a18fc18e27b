package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
	"github.com/p2pnode/p2pnode/trainer"
)

// announcer publishes this node's presence, roles, capacity and head every few seconds.
type announcer struct {
	*env
	capacity *trainer.Capacity
	// started is when this run started (unix ms), announced so that a round's leader can
	// tell a restarted trainer from one that kept its lease.
	started int64
}

func (a *announcer) run(ctx context.Context) error {
	t := time.NewTicker(gossip.AnnounceEvery)
	defer t.Stop()
	for {
		a.announce(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (a *announcer) announce(ctx context.Context) {
	id, h := a.tips.Current()
	msg := &gossip.Announce{Experiment: a.cfg.Experiment.ID, Peer: a.self, Roles: a.cfg.Experiment.Roles,
		Capacity: a.capacity.SamplesPerSecond(), Version: Version, Time: time.Now().UnixMilli(), Started: a.started,
		StepSeconds: a.capacity.StepSeconds()}
	if h != nil {
		msg.Head, msg.Round = id.Bytes(), h.Round
	}
	if err := a.bus.Publish(ctx, msg); err != nil && ctx.Err() == nil {
		a.log.Debug("announce failed", "err", err)
	}
}

// watcher follows the canonical head: it checkpoints, prints progress, updates status and
// ends the run when the round limit is reached.
type watcher struct {
	*env
	stop func()
}

func (w *watcher) run(ctx context.Context) error {
	last := time.Now()
	var lastRound uint64 = math.MaxUint64
	for {
		changed := w.tips.Changed()
		id, h := w.tips.Current()
		if h != nil && h.Round != lastRound {
			took := time.Since(last)
			if lastRound == math.MaxUint64 {
				took = 0
			}
			last, lastRound = time.Now(), h.Round
			w.onHead(ctx, id, h, took)
			if w.done() {
				w.log.Info("round limit reached", "rounds", w.cfg.Experiment.Rounds, "head", id.String())
				w.linger(ctx, h.Round)
				if err := w.keeper.ck.Flush(ctx); err != nil {
					return fmt.Errorf("final checkpoint: %w", err)
				}
				w.stop()
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// finalGrace is how long a validator keeps serving after the last round, so that every
// peer can fetch the final head before it goes away.
const finalGrace = 30 * time.Second

// linger keeps a validator up after the last round until the peers it hears from announce
// the final round (or finalGrace passes).
func (w *watcher) linger(ctx context.Context, final uint64) {
	if !w.cfg.Experiment.HasRole(config.RoleValidator) {
		return
	}
	deadline := time.After(finalGrace)
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		if w.peers.allAt(final) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			w.log.Info("stopping although some peers have not announced the final round")
			return
		case <-t.C:
		}
	}
}

func (w *watcher) onHead(ctx context.Context, id cid.Cid, h *chain.Head, took time.Duration) {
	in, out := w.bytes.delta()
	point := w.roundPoint(id, h)
	point.Seconds, point.BytesIn, point.BytesOut = took.Seconds(), in, out
	// The next head of the chain the history holds is appended; anything else (the first
	// head after a start, a jump after catching up) rebuilds the history from the chain.
	var rebuilt []RoundPoint
	parent, _ := h.ParentID()
	if last, ok := w.status.lastPoint(); !ok || !parent.Defined() || last.Head != parent.String() {
		rebuilt = w.chainHistory(id)
		if n := len(rebuilt); n > 0 && rebuilt[n-1].Head == point.Head && took == 0 {
			// A restarted node follows its tip again: keep what it measured then.
			point = rebuilt[n-1]
		}
	}
	metrics := point.HeldOut
	if err := appendHistory(w.cfg.Node.StoreDir, point); err != nil {
		w.log.Warn("could not record the round in the history", "err", err)
	}
	w.status.update(func(s *Status) {
		s.Head, s.Round, s.Epoch, s.TrainLoss, s.HeadMetrics = id.String(), h.Round, h.Ledger.Epoch, h.Metrics.TrainLoss, metrics
		if rebuilt != nil {
			s.History = rebuilt
		}
		for len(s.History) > 0 && s.History[len(s.History)-1].Round >= h.Round {
			s.History = s.History[:len(s.History)-1]
		}
		s.History = append(s.History, point)
		if len(s.History) > maxHistory {
			s.History = s.History[len(s.History)-maxHistory:]
		}
	})
	w.metrics.head(h.Round, h.Metrics.TrainLoss, metrics)
	if err := atomicfile.Write(filepath.Join(w.cfg.Node.StoreDir, TipFile), []byte(id.String()+"\n"), 0o644); err != nil {
		w.log.Warn("could not record the tip", "err", err)
	}
	if every := uint64(w.cfg.Export.EveryRounds); w.exporter != nil && (h.Round%every == 0 || w.done()) {
		w.exporter.SubmitHead(id)
	}
	if err := w.keeper.headChanged(id, h); err != nil {
		w.log.Error("checkpoint failed", "round", h.Round, "err", err)
		w.status.event("checkpoint", "round %d: %v", h.Round, err)
	}
	if w.progress != nil {
		printProgress(w.progress, w.cfg.Experiment.Rounds, id, h, metrics, took)
	}
}

// errStopped is returned by loops that ended because the experiment is over.
var errStopped = errors.New("stopped")
