// Package headsync owns how a node's canonical head follows the swarm: it accepts signed
// heads and attestations from the bus and catches up from peers that are ahead.
package headsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/progress"
)

// Tips is the node's canonical head: it takes heads offered with their signatures and
// keeps each head's round notes.
type Tips interface {
	Current() (cid.Cid, *chain.Head)
	// Offer makes sh canonical when it has a quorum and extends the current head; it
	// reports whether it did.
	Offer(sh *chain.SignedHead) (bool, error)
	Notes(id cid.Cid) *chain.Notes
	SetNotes(id cid.Cid, round uint64, n *chain.Notes) error
}

// Peers is who this node is connected to, and the chain sync protocol's requests to them.
type Peers interface {
	Connected() []peer.ID
	// Reachable reports whether this node holds a connection to p, direct or relayed.
	Reachable(p peer.ID) bool
	RequestTip(ctx context.Context, p peer.ID) (*chain.Fetched, error)
	RequestHead(ctx context.Context, p peer.ID, id cid.Cid) (*chain.Fetched, error)
}

// Params is what head sync uses.
type Params struct {
	Experiment string
	Self       string // this node's peer ID
	// IsValidator says whether a peer is a configured validator: only their heads and
	// signatures count.
	IsValidator func(peer string) bool
	Bus         bus.Bus
	Tips        Tips
	Heads       *chain.Store
	Peers       Peers
	// FetchArtifacts makes sure the artifacts this node needs of h are stored (or rebuilt),
	// asking hints first: the peer the head came from, then every validator whose
	// signature on it verifies (holders).
	FetchArtifacts func(ctx context.Context, h *chain.Head, hints ...peer.ID) error
	// Seen, when set, is told of every announce (the node's table of peers' rounds).
	Seen func(from string, a *gossip.Announce)
	// Progress shows a long catch-up as it goes (nil: not shown).
	Progress progress.Tracker
	Log      *slog.Logger
}

// New returns head sync; Run runs it.
func New(p Params) *Sync {
	return &Sync{Params: p, asked: map[peer.ID]time.Time{}, pending: map[cid.Cid][]chain.Signature{}}
}

// Sync accepts heads from the bus: it checks who signed them, fetches what the node is
// missing (ancestors from the sender, parameters from holders) and makes them canonical
// through tips. It also catches up when a peer announces a newer round than ours: late
// joiners and nodes back from a partition ask that peer for its tip.
type Sync struct {
	Params
	asked map[peer.ID]time.Time
	// pending holds attestations that arrived before the head they sign.
	pending map[cid.Cid][]chain.Signature
}

const maxPending = 256

const catchUpEvery = 5 * time.Second

// catchUpTips is how many tips one catch-up takes on: when fetching a tip fails and the
// peer has a newer one by then, the catch-up moves on to it at once. A far or slow node's
// download of a tip can outlast the round: the tip's outer state is then pruned at its
// holders (a validator keeps its tip's alone) and the fetch fails; waiting catchUpEvery for
// the next try cost a trainer behind a 250 ms link 5 s of its way back (docs/wan.md,
// faults).
const catchUpTips = 3

// Run accepts heads and attestations from the bus, and catches up from peers that announce
// newer rounds, until ctx ends.
func (s *Sync) Run(ctx context.Context) error {
	in := s.Bus.Subscribe()
	defer in.Close()
	for _, p := range s.Peers.Connected() {
		s.catchUp(ctx, p, 0)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case h := <-in.Heads:
			if err := s.offer(ctx, h.From, h.Msg); errors.Is(err, errSuperseded) {
				s.Log.Debug("head not accepted", "from", h.From, "err", err)
			} else if err != nil && ctx.Err() == nil {
				s.Log.Warn("head not accepted", "from", h.From, "err", err)
			}
		case a := <-in.Attestations:
			s.attest(a.From, a.Msg)
		case a := <-in.Announces:
			if s.Seen != nil {
				s.Seen(a.From, a.Msg)
			}
			// Only from a peer this node holds a connection to: announcements come by
			// gossip from anyone, and a dial to a peer behind NAT hangs for the whole
			// request's timeout while this loop, which takes one message at a time, holds
			// the heads and attestations behind it (a trainer that dialled a validator
			// behind NAT on its announcement missed the round's head for 15 s and gave
			// its lease back). The peers it is connected to (the validators, its
			// bootstrap peers) hold the chain.
			if p, err := peer.Decode(a.From); err == nil && len(a.Msg.Head) > 0 && s.Peers.Reachable(p) {
				s.catchUp(ctx, p, a.Msg.Round)
			}
		}
	}
}

func (s *Sync) offer(ctx context.Context, from string, m *gossip.Head) error {
	if !s.IsValidator(from) {
		return fmt.Errorf("head from %s, which is not a configured validator", from)
	}
	id := m.Signed.ID()
	h, err := m.Signed.Decode()
	if err != nil {
		return err
	}
	// Earlier heads' notes first, so that they are known when this head becomes canonical.
	s.takeEarlierNotes(m.Earlier)
	if cur, ch := s.Tips.Current(); ch != nil && (cur.Equals(id) || h.Round <= ch.Round) {
		if _, _, err := s.Heads.Get(id); err == nil {
			// A head held here comes again with its leader's notes once it evaluated it.
			if err := s.Tips.SetNotes(id, h.Round, m.Notes); err != nil {
				s.Log.Warn("store round notes", "round", h.Round, "err", err)
			}
		}
		s.attestAgain(ctx, from, m, id, h.Round)
		return nil
	}
	p, err := peer.Decode(from)
	if err != nil {
		return err
	}
	fetched, err := s.fetchAncestors(ctx, p, h)
	if err != nil {
		return s.supersededErr(h.Round, err)
	}
	if err := s.FetchArtifacts(ctx, h, s.holders(p, id, m.Signed.Sigs, s.pending[id])...); err != nil {
		return s.supersededErr(h.Round, err)
	}
	if err := s.Tips.SetNotes(id, h.Round, m.Notes); err != nil {
		s.Log.Warn("store round notes", "round", h.Round, "err", err)
	}
	signed := m.Signed
	if sigs, ok := s.pending[id]; ok {
		signed = chain.SignedHead{Head: m.Signed.Head, Sigs: slices.Clone(m.Signed.Sigs)}
		for _, sig := range sigs {
			signed.Add(sig)
		}
		delete(s.pending, id)
	}
	ok, err := s.Tips.Offer(&signed)
	if ok && fetched > 0 {
		s.Log.Info("caught up", "peer", from, "round", h.Round, "head", id.String(), "heads_fetched", fetched)
	}
	return err
}

// takeEarlierNotes keeps the completed notes a head carries of heads held here (the ones
// not held come with the chain when it is fetched). A leader publishes each head before it
// evaluates it: its notes with the held-out metrics go out again later, and the next
// proposals carry them too, for the peers that missed them.
func (s *Sync) takeEarlierNotes(earlier []gossip.EarlierNotes) {
	for _, e := range earlier {
		id, err := cid.Cast(e.Head)
		if err != nil {
			continue
		}
		_, h, err := s.Heads.Get(id)
		if err != nil {
			continue
		}
		if err := s.Tips.SetNotes(id, h.Round, &e.Notes); err != nil {
			s.Log.Warn("store round notes", "round", h.Round, "err", err)
		}
	}
}

// attestAgain answers a head that reached this node without its signature although this
// node signed it: the sender (re-publishing a proposal that waits for quorum) has not seen
// the attestation, which went out once, by gossip, and arrived late or not at all. With a
// quorum of two the attester has the quorum at once while the proposer waits for it, and
// the next round's timing starts from the attester's view (follow). Each re-published
// proposal is answered once.
func (s *Sync) attestAgain(ctx context.Context, from string, m *gossip.Head, id cid.Cid, round uint64) {
	if from == s.Self || !s.IsValidator(s.Self) || chain.FindSignature(m.Signed.Sigs, s.Self) != nil {
		return
	}
	sh, _, err := s.Heads.Get(id)
	if err != nil {
		return
	}
	own := chain.FindSignature(sh.Sigs, s.Self)
	if own == nil {
		return // not signed here (it came by head sync)
	}
	s.Log.Info("re-sending attestation: the sender has not seen it", "round", round, "head", id.String(), "sender", from)
	a := &gossip.Attestation{Experiment: s.Experiment, Head: id.Bytes(), Round: round, Sig: *own, Sent: time.Now().UnixMilli()}
	if err := s.Bus.Publish(ctx, a); err != nil && ctx.Err() == nil {
		s.Log.Warn("publish attestation", "round", round, "err", err)
	}
}

// attest adds a validator's signature to the head it signs; the head becomes canonical
// once it has a quorum. Attestations for heads not seen yet wait in pending.
func (s *Sync) attest(from string, a *gossip.Attestation) {
	if !s.IsValidator(from) || a.Sig.Peer != from {
		return
	}
	id, err := cid.Cast(a.Head)
	if err != nil {
		return
	}
	if chain.VerifySignature(id, a.Sig) != nil {
		return
	}
	sh, _, err := s.Heads.Get(id)
	if err != nil {
		if len(s.pending) < maxPending {
			s.pending[id] = append(s.pending[id], a.Sig)
		}
		return
	}
	sh.Add(a.Sig)
	if _, err := s.Tips.Offer(sh); err != nil {
		s.Log.Debug("attested head not accepted", "head", id.String(), "err", err)
	}
}

// errSuperseded marks a failure to take a head that no longer matters: while it was being
// fetched a head of its round or a later one became canonical here (the sender may have
// pruned its parameters by then). It is logged at debug: the node is where it should be.
var errSuperseded = errors.New("a head as new is canonical by now")

// supersededErr wraps err with errSuperseded when a head of round or later is canonical.
func (s *Sync) supersededErr(round uint64, err error) error {
	if _, cur := s.Tips.Current(); cur != nil && cur.Round >= round {
		return fmt.Errorf("%w: %w", errSuperseded, err)
	}
	return err
}

// catchUpFailed logs a failed catch-up from p to round: a warning, unless the run is
// ending or the node got there (or further) another way meanwhile.
func (s *Sync) catchUpFailed(ctx context.Context, p peer.ID, round uint64, err error) {
	if err = s.supersededErr(round, err); errors.Is(err, errSuperseded) || ctx.Err() != nil {
		s.Log.Debug("catch-up failed", "peer", p.String(), "round", round, "err", err)
		return
	}
	s.Log.Warn("catch-up failed", "peer", p.String(), "round", round, "err", err)
}

// catchUp asks p for its canonical head when p claims a round newer than ours (round 0:
// always ask, at start-up), at most once per catchUpEvery per peer.
func (s *Sync) catchUp(ctx context.Context, p peer.ID, round uint64) {
	if p.String() == s.Self {
		return
	}
	_, cur := s.Tips.Current()
	if cur != nil && round <= cur.Round && round != 0 {
		return
	}
	if time.Since(s.asked[p]) < catchUpEvery {
		return
	}
	s.asked[p] = time.Now()
	var failed error // the last tip's failure
	var failedRound uint64
	for range catchUpTips {
		f, err := s.Peers.RequestTip(ctx, p)
		if err != nil {
			s.Log.Debug("catch-up: no tip from peer", "peer", p.String(), "err", err)
			break
		}
		if _, cur := s.Tips.Current(); cur != nil && f.Head.Round <= cur.Round || failed != nil && f.Head.Round <= failedRound {
			break // nothing newer than what we hold, or than what just failed
		}
		if failed, failedRound = s.catchUpTo(ctx, p, f), f.Head.Round; failed == nil {
			return
		}
	}
	if failed != nil {
		s.catchUpFailed(ctx, p, failedRound, failed)
	}
}

// catchUpTo fetches f, p's tip, with its ancestors and artifacts, and offers it.
func (s *Sync) catchUpTo(ctx context.Context, p peer.ID, f *chain.Fetched) error {
	sh, h := f.Signed, f.Head
	fetched, err := s.fetchAncestors(ctx, p, h)
	if err != nil {
		return err
	}
	if parent, err := h.ParentID(); err == nil && parent.Defined() && fetched == 0 {
		// A head that comes by catch-up carries no earlier heads' notes (gossip.Head.Earlier).
		s.refreshNotes(ctx, p, parent)
	}
	if err := s.FetchArtifacts(ctx, h, s.holders(p, sh.ID(), sh.Sigs)...); err != nil {
		return err
	}
	if err := s.Tips.SetNotes(sh.ID(), h.Round, f.Notes); err != nil {
		s.Log.Warn("store round notes", "round", h.Round, "err", err)
	}
	ok, err := s.Tips.Offer(sh)
	if err != nil {
		// Refused, not missing: a newer tip would not fare better.
		s.Log.Warn("catch-up: head refused", "peer", p.String(), "round", h.Round, "err", err)
		return nil
	}
	if ok {
		s.Log.Info("caught up", "peer", p.String(), "round", h.Round, "head", sh.ID().String())
	}
	return nil
}

// holders are the peers asked for a head's artifacts: from, the peer it came from, then
// each configured validator whose signature on head id verifies. A validator signs a head
// only once it holds its parameters and outer state (it made or recomputed them), so a
// node that cannot reach the head's proposer — a validator behind NAT, whose proposal
// reached it through another peer — fetches them from the validators that attested it
// (docs/wan.md); a download with several holders also takes its chunks from all of them.
func (s *Sync) holders(from peer.ID, id cid.Cid, sigs ...[]chain.Signature) []peer.ID {
	out := []peer.ID{from}
	for _, sig := range slices.Concat(sigs...) {
		p, err := peer.Decode(sig.Peer)
		if err != nil || slices.Contains(out, p) || sig.Peer == s.Self || !s.IsValidator(sig.Peer) || chain.VerifySignature(id, sig) != nil {
			continue
		}
		out = append(out, p)
	}
	return out
}

// fetchAncestors gets the heads between h and the newest ancestor this node holds from p
// (heads are linked by hash, so the tip's signatures vouch for all of them) and says how
// many it fetched.
func (s *Sync) fetchAncestors(ctx context.Context, p peer.ID, h *chain.Head) (n int, err error) {
	var task progress.Task // started at the first head missing
	defer func() {
		if task != nil {
			task.Finish(err)
		}
	}()
	var missing []*chain.Fetched
	for {
		parent, err := h.ParentID()
		if err != nil {
			return 0, err
		}
		if !parent.Defined() {
			break
		}
		if s.Heads.Has(parent) {
			if len(missing) > 0 {
				s.refreshNotes(ctx, p, parent)
			}
			break
		}
		if task == nil {
			task = s.catchUpTask(h.Round)
		}
		f, err := s.Peers.RequestHead(ctx, p, parent)
		if err != nil {
			return 0, fmt.Errorf("fetch ancestor %s of round %d: %w", parent, h.Round, err)
		}
		if f.Head.Round+1 != h.Round {
			return 0, fmt.Errorf("ancestor %s claims round %d under round %d", parent, f.Head.Round, h.Round)
		}
		missing = append(missing, f)
		task.Add(1)
		h = f.Head
	}
	for i := len(missing) - 1; i >= 0; i-- {
		f := missing[i]
		if _, err := s.Heads.Put(f.Signed); err != nil {
			return 0, err
		}
		// The round notes come with the chain, so a node that synced it has the history.
		if err := s.Tips.SetNotes(f.Signed.ID(), f.Head.Round, f.Notes); err != nil {
			s.Log.Warn("store round notes", "round", f.Head.Round, "err", err)
		}
	}
	return len(missing), nil
}

// catchUpTask shows the fetching of the heads up to round: those between the current
// head and it, when it extends the current head.
func (s *Sync) catchUpTask(round uint64) progress.Task {
	total := round
	if _, cur := s.Tips.Current(); cur != nil && cur.Round < round {
		total = round - cur.Round - 1
	}
	return progress.Start(s.Progress, fmt.Sprintf("catching up on the chain to round %d", round), "heads", total, 0)
}

// refreshNotes asks p again for the notes of the last heads this node held before it
// caught up, from id down, where it has none or their held-out metrics are still due. A
// node that stopped, or was cut off, right after a head came holds it with the notes its
// leader published before it evaluated it; it missed the completed notes, which the
// proposals that follow carry only gossip.MaxEarlierNotes heads back.
func (s *Sync) refreshNotes(ctx context.Context, p peer.ID, id cid.Cid) {
	walked := 0
	_ = s.Heads.Walk(id, func(id cid.Cid, h *chain.Head) error {
		if n := s.Tips.Notes(id); n == nil || n.HeldOutDue {
			if f, err := s.Peers.RequestHead(ctx, p, id); err == nil && f.Notes != nil {
				if err := s.Tips.SetNotes(id, h.Round, f.Notes); err != nil {
					s.Log.Warn("store round notes", "round", h.Round, "err", err)
				}
			}
		}
		if walked++; walked == gossip.MaxEarlierNotes {
			return chain.StopWalk
		}
		return nil
	})
}
