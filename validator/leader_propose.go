package validator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/round"
)

// The leader's proposing phase: the merge of what was received, the round's notes and
// the proposal it publishes.

// propose merges what was received and publishes the proposal (nil: nothing survived
// screening, lease again).
func (v *validator) propose(ctx context.Context, r *openRound, took time.Duration) (*lockedHead, error) {
	v.enter(PhaseProposing, r.round)
	cands := make([]round.Candidate, 0, len(r.received))
	var wire []gossip.Candidate
	for p, rc := range r.received {
		delta, _ := cid.Cast(rc.msg.Delta)
		cands = append(cands, round.Candidate{Peer: p, Delta: delta, Lease: rc.id, Samples: rc.msg.Samples,
			Microshards: rc.msg.Microshards, Loss: rc.msg.Loss, Probation: round.OnProbation(r.merges, p),
			Sole: round.Sole(r.merges, p), Ahead: rc.lease.Ahead(r.base)})
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].Peer < cands[j].Peer })
	var leases []lease.Lease
	for _, c := range cands {
		wire = append(wire, gossip.Candidate{Peer: c.Peer, Delta: c.Delta.Bytes(), Lease: c.Lease.Bytes(), Samples: c.Samples,
			Microshards: c.Microshards, Loss: c.Loss})
		leases = append(leases, r.received[c.Peer].lease)
	}
	refID, err := v.reference(ctx, r)
	if err != nil {
		return nil, err
	}
	if refID.Defined() {
		if err := v.fetchBaseReference(ctx, r.base, v.otherValidators()...); err != nil {
			if v.RequireReference || ctx.Err() != nil {
				return nil, err
			}
			// A lone validator whose store lost the tip's reference would never merge
			// again: the round goes without a reference, as when the window fails.
			v.Log.Warn("the base's reference update cannot be fetched: this round is screened without a reference", "round", r.round, "err", err)
			refID = cid.Undef
		}
	}
	mergeStart := time.Now()
	out, err := v.Merger.MergeWith(ctx, r.baseID, r.base, cands, refID)
	v.mergeTook = time.Since(mergeStart)
	rejected := map[string]string{}
	if out != nil {
		for _, rj := range out.Rejected {
			art := ""
			if rc, ok := r.received[rj.Peer]; ok {
				if id, err := cid.Cast(rc.msg.Delta); err == nil {
					art = id.String()
				}
			}
			v.rejected(rj.Peer, r.round, rj.Reason, rj.Detail, art)
			r.reject(rj.Peer, rj.Reason)
			rejected[rj.Peer] = rj.Reason
			delete(r.received, rj.Peer)
			// Its microshards return to the pool, for other trainers: a rejected peer gets
			// no second attempt in the round.
			r.book.Bar(rj.Peer, rj.Reason)
		}
	}
	v.Sink.Status(func(vs *Status) {
		vs.Rejected, vs.Barred = rejected, r.book.Barred()
	})
	if errors.Is(err, round.ErrNothingMerged) {
		r.book.Discard(time.Now())
		if disagreed(rejected) && !r.book.Lone() {
			r.book.Disagreed()
			v.Log.Warn("the round's updates point away from each other and nothing else can tell which is right: "+
				"leasing one trainer at a time for the rest of the round", "round", r.round, "rejected", len(rejected))
			v.Sink.Event("release", "round %d: %d updates disagree with each other; leasing one trainer at a time", r.round, len(rejected))
		}
		v.Sink.Event("release", "round %d: no contribution passed screening; leasing again", r.round)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sh, err := v.sign(out.Head)
	if err != nil {
		return nil, err
	}
	mergeTook := time.Since(mergeStart)
	notes := r.notes(mergeTook)
	notes.Quarantined = quarantineNotes(v.quarantine.List(r.round))
	if v.final(r.round) {
		// Nothing waits for the last head: it goes out with its metrics, after the
		// heads before it have theirs (heldout.go).
		v.evaluated()
		notes.HeldOut = v.evaluate(ctx, out.Head)
		notes.HeldOutFailed = notes.HeldOut == nil && v.evalDue(out.Head) && ctx.Err() == nil
	}
	// The head is evaluated once it is out (heldout.go); its place with the evaluator is
	// taken before it becomes canonical here, and its notes say the metrics will follow.
	later := !v.final(r.round) && v.reserve(ctx, out.Head)
	handed := false
	defer func() {
		if later && !handed {
			v.heldOut.release()
		}
	}()
	notes.HeldOutDue = later
	notes.Seconds = time.Since(r.started).Seconds()
	if err := v.signNotes(out.ID, out.Head.Round, notes); err != nil {
		return nil, err
	}
	msg := &gossip.Head{Experiment: v.Config.Experiment.ID, Signed: *sh, Notes: notes,
		Proposal: &gossip.Proposal{Attempt: r.attempt, Leases: leases, Candidates: wire, Reference: refBytes(refID)},
		Earlier:  v.earlierNotes(out.Head)}
	lk := lockedHead{id: out.ID, msg: msg}
	if err := v.lock(r.round, lk); err != nil {
		return nil, err
	}
	if _, err := v.Tips.Offer(sh); err != nil {
		return nil, err
	}
	v.Sink.RoundClosed(took, len(out.Head.Contributions), notes)
	logArgs := []any{"round", r.round, "head", out.ID.String(), "merged", len(out.Head.Contributions),
		"rejected", len(out.Rejected), "took", took.Round(time.Millisecond).String(), "screened", out.Screened}
	if refID.Defined() {
		logArgs = append(logArgs, "reference_seconds", r.ref.took.Seconds())
	}
	v.Log.Info("proposed head", logArgs...)
	if err := v.Bus.Publish(ctx, msg); err != nil {
		return nil, fmt.Errorf("publish proposal: %w", err)
	}
	if later {
		v.evaluateLater(heldOutJob{id: out.ID, head: out.Head, notes: *notes, msg: *msg})
		handed = true
	}
	return &lk, nil
}

// refBytes is a reference artifact as a proposal names it (nil for none).
func refBytes(id cid.Cid) []byte {
	if !id.Defined() {
		return nil
	}
	return id.Bytes()
}

// notes are the round's time split as its leader saw it, for the merged contributions
// (those still in received): the slowest trainer's inner steps, the longest transfer path
// (a trainer's fetch of the base parameters and microshards, then this validator's fetch of
// its update), and merge (screening, aggregation, signing).
func (r *openRound) notes(merge time.Duration) *chain.Notes {
	n := &chain.Notes{Round: r.round, Rejected: r.rejected, Rejections: r.rejections, MergeSeconds: merge.Seconds()}
	for _, rc := range r.received {
		train := rc.msg.TrainSeconds
		if train == 0 {
			train = rc.msg.Seconds // a trainer that does not report the split
		}
		n.TrainSeconds = max(n.TrainSeconds, train)
		n.CommSeconds = max(n.CommSeconds, rc.msg.FetchSeconds+rc.fetch.Seconds())
	}
	return n
}

// quarantineNotes is a quarantine list (lease.Quarantine.List) as round notes carry it:
// sorted by peer, at most chain.MaxNoteEntries.
func quarantineNotes(list map[string]uint64) []chain.Quarantine {
	var out []chain.Quarantine
	for _, p := range slices.Sorted(maps.Keys(list)) {
		if len(out) == chain.MaxNoteEntries {
			break
		}
		out = append(out, chain.Quarantine{Peer: p, Until: list[p]})
	}
	return out
}

// disagreed reports whether a closing that merged nothing rejected two or more updates for
// their direction: they were held to each other (a young chain's pair) and every retry on
// the base would be too (lease.Book.Disagreed).
func disagreed(rejected map[string]string) bool {
	n := 0
	for _, why := range rejected {
		if why == string(merge.ReasonLowCosine) {
			n++
		}
	}
	return n >= 2
}
