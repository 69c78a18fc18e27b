package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/checkpoint"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/round"
)

const (
	// restorePeerWait bounds how long start-up waits for a first peer when it needs one to
	// replace a damaged head or artifact.
	restorePeerWait = 15 * time.Second
	// maxResumeWalk bounds how many heads back from the tip resumeFromChain looks for one
	// whose artifacts it has or can get.
	maxResumeWalk = 16
)

// restore resumes from the newest good checkpoint; without one, from the newest intact
// head of the local chain. A node with no checkpoint and no chain starts afresh (and
// catches up from peers).
func restore(ctx context.Context, e *env, work *round.Trainer) error {
	until := time.Now().Add(restorePeerWait)
	r, err := e.keeper.Restore()
	if errors.Is(err, checkpoint.ErrNoState) {
		return resumeFromChain(ctx, e, until, err)
	}
	if err != nil {
		return fmt.Errorf("load checkpoint: %w", err)
	}
	id, err := cid.Decode(r.State.Head)
	if err != nil {
		return fmt.Errorf("checkpoint head %q: %w", r.State.Head, err)
	}
	h, err := e.headOrRefetch(ctx, id, until)
	if err != nil {
		// The checkpoint's state belongs to its head; without the head, resume from the chain
		// (the parent heads held here) as when there is no checkpoint.
		e.log.Warn("the checkpoint's head is unreadable here and at every peer: resuming from the head chain", "head", id.String(), "err", err)
		return resumeFromChain(ctx, e, until, fmt.Errorf("checkpoint head: %w", err))
	}
	work.OptState, work.Residual, work.ResidualTag = r.OptPath, r.Residual, r.ResidualTag
	if r.ResidualErr != nil {
		e.log.Warn("error-feedback residual dropped; it starts again from zeros", "err", r.ResidualErr)
	}
	if r.PacesErr != nil {
		e.log.Warn("trainer paces dropped; round deadlines are learnt again", "err", r.PacesErr)
	}
	if tid, th, ok := newerTip(ctx, e, id, h, until); ok {
		e.log.Info("the head chain is ahead of the checkpoint; resuming at its tip", "checkpoint_round", h.Round, "tip_round", th.Round)
		id, h = tid, th
	}
	e.tips.Restore(id, h)
	e.log.Info("resumed", "round", h.Round, "head", id.String(), "checkpoint_generation", r.State.Seq)
	return nil
}

// resumeFromChain rebuilds the node's place in the experiment from the head chain it
// holds when no checkpoint generation is usable (deleted, or all damaged): the tip file's
// head, or else the newest stored head with a quorum. Heads whose files are damaged are
// asked from peers; a head whose artifacts are neither intact here nor to be had from
// peers gives way to its parent. What the checkpoint alone held (a trainer's inner
// optimizer state and error-feedback residual) starts afresh.
func resumeFromChain(ctx context.Context, e *env, until time.Time, why error) error {
	tip, from := e.localTip(ctx)
	if !tip.Defined() {
		e.log.Info("no checkpoint and no head chain here: starting afresh", "store", e.cfg.Node.StoreDir)
		return nil
	}
	var skipped []string
	tried := map[cid.Cid]bool{}
	id := tip
	for range maxResumeWalk {
		tried[id] = true
		h, err := e.headOrRefetch(ctx, id, until)
		if err != nil {
			// A damaged or deleted head file names no parent: go on from the newest head
			// held here with a quorum not tried yet (the parent, when only the tip is
			// damaged).
			skipped = append(skipped, err.Error())
			if id = e.newestQuorumHead(ctx, tried); !id.Defined() {
				break
			}
			continue
		}
		err = e.ensureHeadArtifacts(ctx, h, until)
		if err == nil {
			e.tips.Restore(id, h)
			e.log.Warn("no usable checkpoint generation: resumed from the head chain; a trainer's inner optimizer state and error-feedback residual start afresh",
				"round", h.Round, "head", id.String(), "tip_from", from, "heads_skipped", skipped, "checkpoint", why.Error())
			return nil
		}
		skipped = append(skipped, fmt.Sprintf("round %d: %v", h.Round, err))
		if id, err = h.ParentID(); err != nil || !id.Defined() {
			break
		}
	}
	if !e.cfg.Experiment.HasRole(config.RoleValidator) {
		// A trainer has nothing of its own to lose: it catches up from the swarm's tip.
		e.log.Warn("no usable checkpoint, and the artifacts of the local chain are not here: catching up from peers",
			"tip", tip.String(), "tip_from", from, "heads_skipped", skipped)
		return nil
	}
	return fmt.Errorf("no usable checkpoint (%v), and no head of the last %d back from the tip %s (%s) is readable with its artifacts here or at a peer: %v; "+
		"to recover, start this node with a peer that holds head %s (another of the experiment's validators, in node.bootstrap), "+
		"or restore %s from a backup; to start the experiment afresh instead, move %s aside",
		why, maxResumeWalk, tip, from, skipped, tip, e.cfg.Node.StoreDir, e.cfg.Node.StoreDir)
}

// localTip is the newest canonical head this node recorded: the tip file, or when that is
// gone the newest head in the store that has a quorum of signatures.
func (e *env) localTip(ctx context.Context) (cid.Cid, string) {
	stores := &Stores{Artifacts: e.store, Heads: e.heads, dir: e.cfg.Node.StoreDir}
	if id, err := stores.ResolveHead("latest"); err == nil {
		return id, "tip file"
	}
	return e.newestQuorumHead(ctx, nil), "newest stored head with a quorum"
}

// newestQuorumHead is the stored head of the highest round that reads intact and has a
// quorum of signatures, leaving out those in skip.
func (e *env) newestQuorumHead(ctx context.Context, skip map[cid.Cid]bool) cid.Cid {
	ids, err := e.heads.List()
	if err != nil {
		e.log.Warn("cannot list stored heads", "err", err)
		return cid.Undef
	}
	var best cid.Cid
	var round uint64
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		if skip[id] {
			continue
		}
		sh, h, err := e.heads.Get(id)
		if err != nil {
			continue
		}
		if _, err := sh.Quorum(e.validators, e.cfg.Experiment.Quorum); err != nil {
			continue
		}
		if !best.Defined() || h.Round > round {
			best, round = id, h.Round
		}
	}
	return best
}

// headOrRefetch reads a head from the store; when its file is missing or damaged it asks
// the connected peers for it. The error names the file.
func (e *env) headOrRefetch(ctx context.Context, id cid.Cid, until time.Time) (*chain.Head, error) {
	_, h, err := e.heads.Get(id)
	if err == nil {
		return h, nil
	}
	path := e.heads.Path(id)
	e.log.Warn("head unreadable: asking peers for it", "head", id.String(), "file", path, "err", err)
	for _, p := range e.awaitPeers(ctx, until) {
		f, rerr := chain.RequestHead(ctx, e.host, p, id)
		if rerr != nil {
			e.log.Debug("head not had from peer", "peer", p.String(), "err", rerr)
			continue
		}
		if _, perr := e.heads.Put(f.Signed); perr != nil {
			return nil, fmt.Errorf("head %s from %s: %w", id, p, perr)
		}
		if _, h, gerr := e.heads.Get(id); gerr == nil {
			e.log.Warn("damaged head replaced with a peer's copy", "head", id.String(), "file", path, "peer", p.String())
			return h, nil
		}
	}
	return nil, fmt.Errorf("head %s: file %s: %w (and no connected peer provided it)", id, path, err)
}

// ensureHeadArtifacts checks the artifacts this node needs of a head (see headArtifacts)
// and fetches the missing or damaged ones from peers.
func (e *env) ensureHeadArtifacts(ctx context.Context, h *chain.Head, until time.Time) error {
	for _, get := range e.headArtifacts(h) {
		id, err := get()
		if err != nil {
			return err
		}
		if !id.Defined() {
			continue
		}
		if e.store.Has(id) {
			verr := e.store.Verify(id)
			if verr == nil {
				continue
			}
			e.log.Warn("stored artifact damaged: removing it to fetch it again", "artifact", id.String(), "err", verr)
			if err := e.store.Remove(id); err != nil {
				return err
			}
		}
		if len(e.awaitPeers(ctx, until)) == 0 {
			return fmt.Errorf("artifact %s is not here and no peer is connected", id)
		}
		fctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = e.bus.Fetch(fctx, id)
		cancel()
		if err != nil {
			return fmt.Errorf("artifact %s: %w", id, err)
		}
	}
	return nil
}

// awaitPeers returns the connected peers, first waiting (until the given time) for one:
// even a node with no peers of its own to dial (a lone validator that trainers dial) is
// usually joined within seconds. Only damaged local state makes start-up ask.
func (e *env) awaitPeers(ctx context.Context, until time.Time) []peer.ID {
	if e.host == nil {
		return nil
	}
	for {
		if ps := e.host.Network().Peers(); len(ps) > 0 || time.Now().After(until) {
			return ps
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}
