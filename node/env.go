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
	params, err := h.ParamsID()
	if err != nil {
		return err
	}
	for _, get := range e.headArtifacts(h) {
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

// tryRebuild makes h's parameters and outer state from its parent's and the contributions h
// names (round.Merger.Rebuild), fetching the contributions. It gives up quietly — the caller
// then downloads h's artifacts — when the parent or its artifacts are missing, a
// contribution cannot be fetched, or the result does not have h's CIDs.
func (e *env) tryRebuild(ctx context.Context, h *chain.Head, hints []peer.ID) {
	pid, err := h.ParamsID()
	if err != nil || e.store.Has(pid) || len(h.Contributions) == 0 {
		return
	}
	parentID, err := h.ParentID()
	if err != nil || !parentID.Defined() {
		return
	}
	_, parent, err := e.heads.Get(parentID)
	if err != nil {
		return
	}
	for _, get := range []func() (cid.Cid, error){parent.ParamsID, parent.OuterStateID} {
		if id, err := get(); err != nil || (id.Defined() && !e.store.Has(id)) {
			return
		}
	}
	for _, c := range h.Contributions {
		id, err := cid.Cast(c.Artifact)
		if err != nil {
			return
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
			return
		}
	}
	if err := e.rebuild.Rebuild(ctx, parentID, parent, h); err != nil {
		e.log.Warn("rebuild failed; downloading the head instead", "round", h.Round, "err", err)
		return
	}
	e.log.Info("rebuilt head from its contributions", "round", h.Round, "contributions", len(h.Contributions))
}
