package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/atomicfile"
	"github.com/p2pnode/p2pnode/trainer"
)

// headSync accepts heads from the bus: it checks who signed them, fetches what the node is
// missing (ancestors from the sender, parameters from holders) and makes them canonical
// through tips. It also catches up when a peer announces a newer round than ours: late
// joiners and nodes back from a partition ask that peer for its tip.
type headSync struct {
	*env
	asked map[peer.ID]time.Time
	// pending holds attestations that arrived before the head they sign.
	pending map[cid.Cid][]chain.Signature
}

const maxPending = 256

const catchUpEvery = 5 * time.Second

func (s *headSync) run(ctx context.Context) error {
	in := s.bus.Subscribe()
	defer in.Close()
	s.asked = map[peer.ID]time.Time{}
	s.pending = map[cid.Cid][]chain.Signature{}
	for _, p := range s.host.Network().Peers() {
		s.catchUp(ctx, p, 0)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case h := <-in.Heads:
			if err := s.offer(ctx, h.From, h.Msg); err != nil && ctx.Err() == nil {
				s.log.Warn("head not accepted", "from", h.From, "err", err)
			}
		case a := <-in.Attestations:
			s.attest(a.From, a.Msg)
		case a := <-in.Announces:
			s.peers.seen(a.From, a.Msg)
			if p, err := peer.Decode(a.From); err == nil && len(a.Msg.Head) > 0 {
				s.catchUp(ctx, p, a.Msg.Round)
			}
		}
	}
}

func (s *headSync) offer(ctx context.Context, from string, m *gossip.Head) error {
	if !s.isValidator(from) {
		return fmt.Errorf("head from %s, which is not a configured validator", from)
	}
	id := m.Signed.ID()
	h, err := m.Signed.Decode()
	if err != nil {
		return err
	}
	if cur, ch := s.tips.Current(); ch != nil && (cur.Equals(id) || h.Round <= ch.Round) {
		s.attestAgain(ctx, from, m, id, h.Round)
		return nil
	}
	p, err := peer.Decode(from)
	if err != nil {
		return err
	}
	fetched, err := s.fetchAncestors(ctx, p, h)
	if err != nil {
		return err
	}
	if err := s.fetchHeadArtifacts(ctx, h, p); err != nil {
		return err
	}
	if err := s.tips.SetNotes(id, h.Round, m.Notes); err != nil {
		s.log.Warn("store round notes", "round", h.Round, "err", err)
	}
	signed := m.Signed
	if sigs, ok := s.pending[id]; ok {
		signed = chain.SignedHead{Head: m.Signed.Head, Sigs: slices.Clone(m.Signed.Sigs)}
		for _, sig := range sigs {
			signed.Add(sig)
		}
		delete(s.pending, id)
	}
	ok, err := s.tips.Offer(&signed)
	if ok && fetched > 0 {
		s.log.Info("caught up", "peer", from, "round", h.Round, "head", id.String(), "heads_fetched", fetched)
	}
	return err
}

// attestAgain answers a head that reached this node without its signature although this
// node signed it: the sender (re-publishing a proposal that waits for quorum) has not seen
// the attestation, which went out once, by gossip, and arrived late or not at all. With a
// quorum of two the attester has the quorum at once while the proposer waits for it, and
// the next round's timing starts from the attester's view (follow). Each re-published
// proposal is answered once.
func (s *headSync) attestAgain(ctx context.Context, from string, m *gossip.Head, id cid.Cid, round uint64) {
	if from == s.self || !s.isValidator(s.self) || findSig(m.Signed.Sigs, s.self) != nil {
		return
	}
	sh, _, err := s.heads.Get(id)
	if err != nil {
		return
	}
	own := findSig(sh.Sigs, s.self)
	if own == nil {
		return // not signed here (it came by head sync)
	}
	s.log.Info("re-sending attestation: the sender has not seen it", "round", round, "head", id.String(), "sender", from)
	a := &gossip.Attestation{Experiment: s.cfg.Experiment.ID, Head: id.Bytes(), Round: round, Sig: *own, Sent: time.Now().UnixMilli()}
	if err := s.bus.Publish(ctx, a); err != nil && ctx.Err() == nil {
		s.log.Warn("publish attestation", "round", round, "err", err)
	}
}

// attest adds a validator's signature to the head it signs; the head becomes canonical
// once it has a quorum. Attestations for heads not seen yet wait in pending.
func (s *headSync) attest(from string, a *gossip.Attestation) {
	if !s.isValidator(from) || a.Sig.Peer != from {
		return
	}
	id, err := cid.Cast(a.Head)
	if err != nil {
		return
	}
	if chain.VerifySignature(id, a.Sig) != nil {
		return
	}
	sh, _, err := s.heads.Get(id)
	if err != nil {
		if len(s.pending) < maxPending {
			s.pending[id] = append(s.pending[id], a.Sig)
		}
		return
	}
	sh.Add(a.Sig)
	if _, err := s.tips.Offer(sh); err != nil {
		s.log.Debug("attested head not accepted", "head", id.String(), "err", err)
	}
}

// catchUp asks p for its canonical head when p claims a round newer than ours (round 0:
// always ask, at start-up), at most once per catchUpEvery per peer.
func (s *headSync) catchUp(ctx context.Context, p peer.ID, round uint64) {
	if p == s.host.ID() {
		return
	}
	_, cur := s.tips.Current()
	if cur != nil && round <= cur.Round && round != 0 {
		return
	}
	if time.Since(s.asked[p]) < catchUpEvery {
		return
	}
	s.asked[p] = time.Now()
	f, err := chain.RequestTip(ctx, s.host, p)
	if err != nil {
		s.log.Debug("catch-up: no tip from peer", "peer", p.String(), "err", err)
		return
	}
	sh, h := f.Signed, f.Head
	if cur != nil && h.Round <= cur.Round {
		return
	}
	if _, err := s.fetchAncestors(ctx, p, h); err != nil {
		s.log.Warn("catch-up failed", "peer", p.String(), "round", h.Round, "err", err)
		return
	}
	if err := s.fetchHeadArtifacts(ctx, h, p); err != nil {
		s.log.Warn("catch-up failed", "peer", p.String(), "round", h.Round, "err", err)
		return
	}
	if err := s.tips.SetNotes(sh.ID(), h.Round, f.Notes); err != nil {
		s.log.Warn("store round notes", "round", h.Round, "err", err)
	}
	ok, err := s.tips.Offer(sh)
	if err != nil {
		s.log.Warn("catch-up: head refused", "peer", p.String(), "round", h.Round, "err", err)
		return
	}
	if ok {
		s.log.Info("caught up", "peer", p.String(), "round", h.Round, "head", sh.ID().String())
	}
}

// fetchAncestors gets the heads between h and the newest ancestor this node holds from p
// (heads are linked by hash, so the tip's signatures vouch for all of them) and says how
// many it fetched.
func (s *headSync) fetchAncestors(ctx context.Context, p peer.ID, h *chain.Head) (int, error) {
	var missing []*chain.Fetched
	for {
		parent, err := h.ParentID()
		if err != nil {
			return 0, err
		}
		if !parent.Defined() || s.heads.Has(parent) {
			break
		}
		f, err := chain.RequestHead(ctx, s.host, p, parent)
		if err != nil {
			return 0, fmt.Errorf("fetch ancestor %s of round %d: %w", parent, h.Round, err)
		}
		if f.Head.Round+1 != h.Round {
			return 0, fmt.Errorf("ancestor %s claims round %d under round %d", parent, f.Head.Round, h.Round)
		}
		missing = append(missing, f)
		h = f.Head
	}
	for i := len(missing) - 1; i >= 0; i-- {
		f := missing[i]
		if _, err := s.heads.Put(f.Signed); err != nil {
			return 0, err
		}
		// The round notes come with the chain, so a node that synced it has the history.
		if err := s.tips.SetNotes(f.Signed.ID(), f.Head.Round, f.Notes); err != nil {
			s.log.Warn("store round notes", "round", f.Head.Round, "err", err)
		}
	}
	return len(missing), nil
}

// announcer publishes this node's presence, roles, capacity and head every few seconds.
type announcer struct {
	*env
	capacity *trainer.Capacity
	// started is when this run started (unix ms), announced so that a round's leader can
	// tell a restarted trainer from one that kept its lease.
	started int64
}

func (a *announcer) run(ctx context.Context) error {
	t := time.NewTicker(announceEvery)
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
