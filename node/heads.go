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
	"github.com/p2pnode/p2pnode/credit"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
	"github.com/p2pnode/p2pnode/internal/version"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/trainer"
	"github.com/p2pnode/p2pnode/upkeep"
)

// announcer publishes this node's presence, roles, capacity and head every few seconds.
type announcer struct {
	*env
	capacity *trainer.Capacity
	// started is when this run started (unix ms), announced so that a round's leader can
	// tell a restarted trainer from one that kept its lease.
	started int64
	// anchor is the anchor head (upkeep.AnchorEvery) of the head anchorFor names, found
	// by walking back from it once per head.
	anchor    *chain.Head
	anchorFor cid.Cid
}

func (*announcer) name() string { return "announce" }

func (a *announcer) run(ctx context.Context, s *startup) error {
	a.capacity = s.capacity
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
		Capacity: a.capacity.SamplesPerSecond(), Version: version.Agent(), Time: time.Now().UnixMilli(), Started: a.started,
		StepSeconds: a.capacity.StepSeconds()}
	if h != nil {
		msg.Head, msg.Round = id.Bytes(), h.Round
		msg.Artifacts = a.heldArtifacts(h)
		if anchor := a.anchorOf(id); anchor != nil && anchor.Round != h.Round {
			msg.Artifacts = append(msg.Artifacts, a.heldArtifacts(anchor)...)
		}
	}
	if err := a.bus.Publish(ctx, msg); err != nil && ctx.Err() == nil {
		a.log.Debug("announce failed", "err", err)
	}
}

// anchorOf is the anchor head of head id: the newest head at or before it whose round is a
// multiple of upkeep.AnchorEvery (nil if a head on the way is not held here). A node on
// the sparse codec keeps its artifacts, and a late joiner downloads them (env.tryRebuild).
func (a *announcer) anchorOf(id cid.Cid) *chain.Head {
	if a.anchorFor.Equals(id) {
		return a.anchor
	}
	var anchor *chain.Head
	_ = a.heads.Walk(id, func(_ cid.Cid, hh *chain.Head) error {
		if upkeep.IsAnchor(hh.Round) {
			anchor = hh
			return chain.StopWalk
		}
		return nil
	})
	a.anchor, a.anchorFor = anchor, id
	return anchor
}

// heldArtifacts are the artifacts of h (the current head, or its anchor) that this node
// holds: it announces them, and a node catching up (a late joiner) takes chunks from it as
// well as from the head's validators (artifact.Exchange.AddCopy: over a direct connection
// only).
func (a *announcer) heldArtifacts(h *chain.Head) [][]byte {
	var out [][]byte
	for _, get := range []func() (cid.Cid, error){h.ParamsID, h.OuterStateID} {
		if id, err := get(); err == nil && id.Defined() && a.store.Has(id) {
			out = append(out, id.Bytes())
		}
	}
	return out
}

// watcher follows the canonical head: it checkpoints, prints progress, updates status and
// ends the run when the round limit is reached.
type watcher struct {
	*env
	stop func()
	// bare holds the rounds (by head) whose progress line went out while their held-out
	// metrics were still due: the metrics get a line of their own when they come.
	bare map[string]uint64
	// teller tells a trainer what the round notes say of its own work (nil: not a trainer).
	teller *credit.Teller
	// credits are every peer's account, as of the last head recorded.
	credits creditBook
}

func (*watcher) name() string { return "watch" }

func (w *watcher) run(ctx context.Context, _ *startup) error {
	last := time.Now()
	var lastRound uint64 = math.MaxUint64
	// Heads recorded in chain order once their held-out metrics come (validator/heldout.go):
	// a head waits for them until maxAwaited later heads have come.
	var waiting []headSeen
	if w.cfg.Experiment.HasRole(config.RoleTrainer) {
		var from uint64
		if _, h := w.tips.Current(); h != nil {
			from = h.Round // a restarted trainer is not told its history again
		}
		w.teller = credit.NewTeller(w.self, from)
	}
	for {
		changed, notes := w.tips.Changed(), w.tips.NotesChanged()
		id, h := w.tips.Current()
		if h != nil && h.Round != lastRound {
			took := time.Since(last)
			if lastRound == math.MaxUint64 {
				took = 0
			}
			last, lastRound = time.Now(), h.Round
			waiting = append(waiting, w.onHead(id, h, took))
			if w.done() {
				for _, s := range waiting {
					w.tell(s.id)
					w.record(s)
				}
				w.log.Info("round limit reached", "rounds", w.cfg.Experiment.Rounds, "head", id.String())
				w.linger(ctx, h.Round)
				if err := w.keeper.Flush(ctx); err != nil {
					return fmt.Errorf("final checkpoint: %w", err)
				}
				w.stop()
				return nil
			}
		}
		if h != nil {
			w.tell(id) // the tip's notes may come after the tip
		}
		for len(waiting) > 0 && (len(waiting) > maxAwaited || !w.awaitsHeldOut(waiting[0].id)) {
			w.tell(waiting[0].id)
			w.record(waiting[0])
			waiting = waiting[1:]
		}
		w.completeRecorded()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-notes:
		}
	}
}

// maxAwaited is how many later heads a head waits for its held-out metrics: a leader
// evaluates one head while the next is proposed, and one more may wait (heldout.go).
const maxAwaited = 2

// headSeen is a new canonical head as the watcher saw it arrive: the round's wall time and
// the bytes this node moved since the last one.
type headSeen struct {
	id                cid.Cid
	h                 *chain.Head
	took              time.Duration
	bytesIn, bytesOut uint64
}

// awaitsHeldOut reports whether head id's round is recorded later: its leader said in the
// head's notes that the held-out metrics follow (validator/heldout.go), and they have not
// come yet. The eval_every that counts is the leader's, not this node's (a trainer's is 0).
func (w *watcher) awaitsHeldOut(id cid.Cid) bool {
	n := w.tips.Notes(id)
	return n != nil && n.HeldOutDue
}

// lateNotesRounds is how many of the last recorded rounds take held-out metrics that come
// after they were recorded.
const lateNotesRounds = 2 * gossip.MaxEarlierNotes

// completeRecorded adds held-out metrics (or word that their evaluation failed) that came
// after their round was recorded to the history on the status page (and to the head's
// metrics when it is the latest): a node that synced heads before their leader evaluated
// them, or that waited maxAwaited heads in vain, takes them from the proposals that follow
// (gossip.Head.Earlier). The history
// file needs no change: what it keeps of a round beside the chain's notes is this node's
// own measurements.
func (w *watcher) completeRecorded() {
	var bare []string
	w.status.Update(func(s *status.Status) {
		for _, p := range s.History[max(0, len(s.History)-lateNotesRounds):] {
			if p.HeldOut == nil && !p.HeldOutFailed {
				bare = append(bare, p.Head)
			}
		}
	})
	found := map[string]*chain.Notes{}
	for _, h := range bare {
		if id, err := cid.Decode(h); err == nil {
			if n := w.tips.Notes(id); n != nil && n.Completed() {
				found[h] = n
			}
		}
	}
	if len(found) == 0 {
		return
	}
	var latest *status.RoundPoint
	var completed []status.RoundPoint
	w.status.Update(func(s *status.Status) {
		for i := max(0, len(s.History)-lateNotesRounds); i < len(s.History); i++ {
			p := &s.History[i]
			n, ok := found[p.Head]
			if !ok || p.HeldOut != nil || p.HeldOutFailed {
				continue
			}
			p.SetNotes(n)
			completed = append(completed, *p)
			if i == len(s.History)-1 {
				l := *p
				latest = &l
			}
			if s.Head == p.Head {
				s.HeadMetrics = n.HeldOut
			}
		}
	})
	if latest != nil {
		w.metrics.Head(latest.Round, latest.TrainLoss, latest.HeldOut)
	}
	for _, p := range completed {
		if _, ok := w.bare[p.Head]; ok && w.progress != nil {
			status.PrintLateMetrics(w.progress, w.cfg.Experiment.Rounds, p)
		}
		delete(w.bare, p.Head)
	}
}

// printedBare notes that round's progress line (head id) went out while its held-out
// metrics were still due, keeping the last lateNotesRounds such rounds (completeRecorded
// looks no further back).
func (w *watcher) printedBare(id string, round uint64) {
	if w.bare == nil {
		w.bare = map[string]uint64{}
	}
	w.bare[id] = round
	for h, r := range w.bare {
		if r+lateNotesRounds < round {
			delete(w.bare, h)
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
		if w.peers.AllAt(final) {
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

// onHead does what a new canonical head asks of this node at once: status, tip file,
// export and checkpoint. The round's history point and progress line are record's.
func (w *watcher) onHead(id cid.Cid, h *chain.Head, took time.Duration) headSeen {
	in, out := w.bytes.Delta()
	w.status.Update(func(s *status.Status) {
		// The head's held-out metrics come with its record.
		s.Head, s.Round, s.Epoch, s.TrainLoss, s.HeadMetrics = id.String(), h.Round, h.Ledger.Epoch, h.Metrics.TrainLoss, nil
	})
	if err := atomicfile.Write(filepath.Join(w.cfg.Node.StoreDir, TipFile), []byte(id.String()+"\n"), 0o644); err != nil {
		w.log.Warn("could not record the tip", "err", err)
	}
	if every := uint64(w.cfg.Export.EveryRounds); w.exporter != nil && (h.Round%every == 0 || w.done()) {
		w.exporter.SubmitHead(id)
	}
	if err := w.keeper.HeadChanged(id, h); err != nil {
		w.log.Error("checkpoint failed", "round", h.Round, "err", err)
		w.status.Event("checkpoint", "round %d: %v", h.Round, err)
	}
	return headSeen{id: id, h: h, took: took, bytesIn: in, bytesOut: out}
}

// record adds a head's round to the history, the status page, the metrics and the
// progress output, with the round notes known now.
func (w *watcher) record(seen headSeen) {
	id, h, took := seen.id, seen.h, seen.took
	point := status.HeadPoint(w.tips, id, h)
	point.Seconds, point.BytesIn, point.BytesOut = took.Seconds(), seen.bytesIn, seen.bytesOut
	// The next head of the chain the history holds is appended; anything else (the first
	// head after a start, a jump after catching up) rebuilds the history from the chain.
	var rebuilt []status.RoundPoint
	parent, _ := h.ParentID()
	if last, ok := w.status.LastPoint(); !ok || !parent.Defined() || last.Head != parent.String() {
		rebuilt = status.ChainHistory(w.cfg.Node.StoreDir, w.heads, w.tips, w.log, id)
		if n := len(rebuilt); n > 0 && rebuilt[n-1].Head == point.Head && took == 0 {
			// A restarted node follows its tip again: keep what it measured then.
			point = rebuilt[n-1]
		}
	}
	metrics := point.HeldOut
	if err := status.AppendHistory(w.cfg.Node.StoreDir, point); err != nil {
		w.log.Warn("could not record the round in the history", "err", err)
	}
	w.status.Update(func(s *status.Status) {
		if s.Head == point.Head {
			s.HeadMetrics = metrics
		}
		if rebuilt != nil {
			s.History = rebuilt
		}
		for len(s.History) > 0 && s.History[len(s.History)-1].Round >= h.Round {
			s.History = s.History[:len(s.History)-1]
		}
		s.History = append(s.History, point)
		if len(s.History) > status.MaxHistory {
			s.History = s.History[len(s.History)-status.MaxHistory:]
		}
	})
	w.countCredit(id, h)
	w.metrics.Head(h.Round, h.Metrics.TrainLoss, metrics)
	if w.progress != nil {
		status.PrintProgress(w.progress, w.cfg.Experiment.Rounds, id, h, metrics, point.HeldOutFailed, took)
		if metrics == nil && w.awaitsHeldOut(id) {
			w.printedBare(point.Head, h.Round)
		}
	}
}

// errStopped is returned by loops that ended because the experiment is over.
var errStopped = errors.New("stopped")
