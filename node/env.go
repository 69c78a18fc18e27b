package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/export"
	"github.com/p2pnode/p2pnode/internal/progress"
	"github.com/p2pnode/p2pnode/p2p"
	"github.com/p2pnode/p2pnode/pyruntime"
	"github.com/p2pnode/p2pnode/round"
	"github.com/p2pnode/p2pnode/status"
	"github.com/p2pnode/p2pnode/upkeep"
)

// env is what every role loop shares.
type env struct {
	cfg *config.Config
	// policy is the merge policy the config maps to (mergePolicy), made once.
	policy     round.Policy
	log        *slog.Logger
	rootLog    *slog.Logger // the logger without pkg, for loggers of other packages
	self       string
	key        crypto.PrivKey
	host       host.Host
	bus        bus.Bus
	tips       *chain.Tips
	store      *artifact.Store
	heads      *chain.Store
	rt         pyruntime.Runtime // nil when the node runs no workload
	status     *status.Board
	keeper     *upkeep.Keeper
	validators validatorPeers // peers whose signatures make a head canonical
	progress   io.Writer
	work       progress.Tracker // shows long work (Options.Work); nil: not shown
	metrics    *status.Metrics
	peers      *status.PeerRounds // rounds announced by peers
	bytes      *p2p.ByteMeter     // libp2p bytes moved, per round
	wrapWork   wrapWindows        // what the trainer loop trains with, made of its round.Trainer
	exporter   *export.Writer     // keeps export.dir current; nil when export is off
	rebuild    *round.Merger      // rebuilds heads from their contributions (see rebuildsHeads); nil if not
	pruner     *upkeep.Pruner     // deletes old artifacts after checkpoints; nil with node.archive
}

func (e *env) isValidator(p string) bool { return slices.Contains(e.validators, p) }

// done reports whether the experiment's round limit is reached.
func (e *env) done() bool {
	_, h := e.tips.Current()
	return h != nil && e.cfg.Experiment.RoundLimitReached(h.Round)
}

// headArtifacts lists the artifacts of h this node needs: the parameters always, the
// outer optimizer state only on a validator, which merges from it. A trainer trains on the
// parameters alone and does not download the momentum (docs/design-notes.md, "What a
// trainer fetches").
//
// A node that rebuilds heads keeps the outer state too: it fetches it once, when it has no
// parent to rebuild from, and afterwards makes it itself.
//
// The outer state comes first: its holders keep it for their tip alone (upkeep), so a node
// taking a head that is no longer the swarm's tip — a late joiner working through the
// heads that came while it downloaded — finds it gone at once instead of after
// downloading the parameters for nothing (a lab run: 4 s a stale head, at 20 Mbit/s and
// 17 MB, while the rounds took 3–7 s and the joiner fell further behind).
func (e *env) headArtifacts(h *chain.Head) []func() (cid.Cid, error) {
	if e.cfg.Experiment.HasRole(config.RoleValidator) || e.rebuild != nil {
		return []func() (cid.Cid, error){h.OuterStateID, h.ParamsID}
	}
	return []func() (cid.Cid, error){h.ParamsID}
}

// fetchHeadArtifacts makes sure the artifacts a head needs to be trained on or merged from
// (see headArtifacts) are in the local store, before the head can become canonical here.
func (e *env) fetchHeadArtifacts(ctx context.Context, h *chain.Head, hints ...peer.ID) error {
	if e.rebuild != nil {
		e.tryRebuild(ctx, h, hints)
	}
	return e.fetchArtifacts(ctx, h, e.headArtifacts(h), hints)
}

// fetchArtifacts fetches the artifacts of h that gets name and the store lacks, in order,
// asking hints first.
func (e *env) fetchArtifacts(ctx context.Context, h *chain.Head, gets []func() (cid.Cid, error), hints []peer.ID) error {
	params, err := h.ParamsID()
	if err != nil {
		return err
	}
	for _, get := range gets {
		id, err := get()
		if err != nil {
			return err
		}
		if !id.Defined() || e.store.Has(id) {
			continue
		}
		what := "parameters"
		if !id.Equals(params) {
			what = "outer optimizer state"
		}
		named := progress.WithName(ctx, fmt.Sprintf("fetching round %d's %s", h.Round, what))
		if err := e.bus.Fetch(named, id, hints...); err != nil {
			return fmt.Errorf("head round %d: fetch %s: %w", h.Round, id, err)
		}
	}
	return nil
}

// rebuildRounds bounds how many heads one rebuild makes, h and the ancestors before it
// that this node does not hold: as many rounds as the swarm keeps contributions of
// (upkeep.ContribRounds) and the tip.
const rebuildRounds = upkeep.ContribRounds + 1

// tryRebuild makes h's parameters and outer state from its parent's and the contributions h
// names (round.Merger.Rebuild), fetching the contributions. A parent this node does not
// hold either is rebuilt first, and so on back to the newest ancestor whose parameters and
// outer state are here (at most rebuildRounds heads). A node that holds none of them — a
// late joiner — downloads the anchor's instead (the newest ancestor whose round is a
// multiple of upkeep.AnchorEvery, which holders keep for that many rounds) and rebuilds
// from it: downloading h's, a slow node would find them pruned, or be rounds behind again
// when they arrived (h's outer state is kept by its holders while h is their tip alone).
// The contributions of those rounds are kept by holders on the sparse codec
// (upkeep.Pruner). It gives up quietly — the caller then downloads h's artifacts — when h
// is an anchor itself, neither is near, something cannot be fetched, or a result does not
// have its head's CIDs.
func (e *env) tryRebuild(ctx context.Context, h *chain.Head, hints []peer.ID) {
	pid, err := h.ParamsID()
	if err != nil || e.store.Has(pid) {
		return
	}
	var todo []*chain.Head // h and the ancestors to rebuild before it, newest first
	var anchor *chain.Head
	anchorAt := 0 // todo[:anchorAt] are the heads after the anchor
	for cur := h; len(todo) < rebuildRounds; {
		todo = append(todo, cur)
		parentID, err := cur.ParentID()
		if err != nil || !parentID.Defined() {
			break
		}
		_, parent, err := e.heads.Get(parentID)
		if err != nil {
			break
		}
		if e.holdsBase(parent) {
			e.rebuildAll(ctx, todo, hints)
			return
		}
		if anchor == nil && upkeep.IsAnchor(parent.Round) {
			anchor, anchorAt = parent, len(todo)
		}
		cur = parent
	}
	if anchor == nil || upkeep.IsAnchor(h.Round) {
		return
	}
	if err := e.fetchArtifacts(ctx, anchor, []func() (cid.Cid, error){anchor.OuterStateID, anchor.ParamsID}, hints); err != nil {
		e.log.Debug("rebuild: the anchor is unavailable; downloading the head instead", "round", h.Round, "anchor", anchor.Round, "err", err)
		return
	}
	e.log.Info("downloaded the anchor head to rebuild the heads after it", "anchor", anchor.Round, "round", h.Round)
	e.rebuildAll(ctx, todo[:anchorAt], hints)
}

// rebuildAll rebuilds heads (listed newest first) from the oldest on, stopping at the
// first that cannot be.
func (e *env) rebuildAll(ctx context.Context, heads []*chain.Head, hints []peer.ID) {
	for i := len(heads) - 1; i >= 0; i-- {
		if !e.rebuildOne(ctx, heads[i], hints) {
			return
		}
	}
}

// holdsBase reports whether h's parameters and outer state are here: a head can be
// rebuilt on it.
func (e *env) holdsBase(h *chain.Head) bool {
	for _, get := range []func() (cid.Cid, error){h.ParamsID, h.OuterStateID} {
		if id, err := get(); err != nil || (id.Defined() && !e.store.Has(id)) {
			return false
		}
	}
	return true
}

// rebuildOne rebuilds h on its parent, which this node holds, fetching h's contributions
// from their trainers and hints; it reports whether it did.
func (e *env) rebuildOne(ctx context.Context, h *chain.Head, hints []peer.ID) bool {
	if len(h.Contributions) == 0 {
		return false
	}
	parentID, err := h.ParentID()
	if err != nil {
		return false
	}
	_, parent, err := e.heads.Get(parentID)
	if err != nil {
		return false
	}
	for _, c := range h.Contributions {
		id, err := cid.Cast(c.Artifact)
		if err != nil {
			return false
		}
		if e.store.Has(id) {
			continue
		}
		from := slices.Clone(hints)
		if p, err := peer.Decode(c.Peer); err == nil {
			from = append(from, p)
		}
		if err := e.bus.Fetch(ctx, id, from...); err != nil {
			e.log.Debug("rebuild: contribution unavailable; downloading the head instead", "round", h.Round, "peer", c.Peer, "err", err)
			return false
		}
	}
	if err := e.rebuild.Rebuild(ctx, parentID, parent, h); err != nil {
		e.log.Warn("rebuild failed; downloading the head instead", "round", h.Round, "err", err)
		return false
	}
	e.log.Info("rebuilt head from its contributions", "round", h.Round, "contributions", len(h.Contributions))
	return true
}
