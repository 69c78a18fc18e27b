package validator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sync/errgroup"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
)

// checks runs the checks of other validators' proposals — the recomputation of a round's
// merge (verifyProposal) and the fetch of the head's artifacts — off the validator's loop,
// one at a time, and hands each verdict back to whichever loop runs as an event
// (checkDone), where the validator signs, locks and attests: the locks are the loop's
// alone. While a proposal of a large model is recomputed (minutes at 1 B parameters), the
// loop goes on reading grants, heartbeats, announcements and heads; blocked, it read none,
// and a trainer whose announcements queued unread meanwhile looked silent afterwards.
//
// A proposal that arrives while another is checked waits, the latest of each proposer,
// and is checked next if it is still for the open round. A head is not checked twice at
// once, and one found not to match its recomputation is not checked again.
type checks struct {
	done    chan checkResult
	running *check
	queued  []*check // at most one per proposer, in arrival order
	// refuted are proposals whose recomputation gave another head or whose leases are
	// invalid, by round: re-published every few seconds, they would be recomputed again
	// each time.
	refuted map[cid.Cid]uint64
}

// check is one proposal to check: the head from proposes, and the canonical head it is
// checked against (base nil for genesis).
type check struct {
	from   string
	m      *gossip.Head
	h      *chain.Head
	id     cid.Cid
	baseID cid.Cid
	base   *chain.Head
	cancel context.CancelFunc
}

type checkResult struct {
	*check
	err error
	// took is how long the recomputation took (0: none ran, as for genesis).
	took time.Duration
}

// errNoArtifacts marks a check that could not fetch the proposed head's artifacts.
var errNoArtifacts = errors.New("cannot fetch the proposed head's artifacts")

func newChecks() *checks {
	return &checks{done: make(chan checkResult), refuted: map[cid.Cid]uint64{}}
}

// busy says whether a proposal of round is being checked or waits to be.
func (c *checks) busy(round uint64) bool {
	if c.running != nil && c.running.h.Round == round {
		return true
	}
	return slices.ContainsFunc(c.queued, func(q *check) bool { return q.h.Round == round })
}

// holdBack says whether a takeover (or a retake) of round that is due now waits for the
// verdict on a proposal of the round being checked. since is when checks first held it
// back (zero: they do not now); they hold it back for at most limit, one recomputation's
// bound: a proposer whose heads keep failing without being refuted (their updates cannot
// be fetched, say), re-published and checked again and again, is passed over then.
func (c *checks) holdBack(round uint64, since *time.Time, limit time.Duration) bool {
	if !c.busy(round) {
		*since = time.Time{}
		return false
	}
	if since.IsZero() {
		*since = time.Now()
	}
	return time.Since(*since) < limit
}

// closed cancels the check running for a round up to closed (the canonical head has moved
// past it: its verdict would be thrown away) and forgets those rounds' refuted heads. The
// cancelled check still reports; the next starts after it has (one at a time).
func (c *checks) closed(closed uint64) {
	if c.running != nil && c.running.h.Round <= closed {
		c.running.cancel()
	}
	for id, r := range c.refuted {
		if r <= closed {
			delete(c.refuted, id)
		}
	}
}

// proposed takes in a head another validator published: a proposal for the round after
// the canonical head (or genesis, while there is none) that this validator has signed
// nothing for is checked off the loop, and attested when its verdict comes back
// (checkDone). Anything else is left to head sync.
func (v *validator) proposed(ctx context.Context, from string, m *gossip.Head) {
	c := v.checkable(from, m, true)
	if c == nil {
		return
	}
	if r := v.checks.running; r != nil {
		if !r.id.Equals(c.id) {
			v.checks.queued = append(slices.DeleteFunc(v.checks.queued, func(q *check) bool { return q.from == c.from }), c)
		}
		return
	}
	v.startCheck(ctx, c)
}

// checkable says what to check of proposal m from a validator, against the canonical head
// now: nil when there is nothing to check.
func (v *validator) checkable(from string, m *gossip.Head, warn bool) *check {
	if m.Proposal == nil || from == v.Self || !v.isValidator(from) {
		return nil
	}
	h, err := m.Signed.Decode()
	if err != nil {
		return nil
	}
	c := &check{from: from, m: m, h: h, id: m.Signed.ID()}
	c.baseID, c.base = v.Tips.Current()
	if h.Round == 0 {
		if c.base != nil || !v.genesisAcceptable(from, h, warn) {
			return nil
		}
		c.baseID = cid.Undef
	} else if c.base == nil || h.Round != c.base.Round+1 || !slices.Equal(h.Parent, c.baseID.Bytes()) {
		return nil // not for the open round; head sync deals with heads of other rounds
	}
	if l, locked := v.locks[h.Round]; locked {
		if !l.id.Equals(c.id) && warn {
			v.Log.Info("not attesting a second head for the round", "round", h.Round, "proposer", from, "signed", l.id.String())
		}
		return nil
	}
	if _, no := v.checks.refuted[c.id]; no {
		return nil
	}
	return c
}

// genesisAcceptable checks what can be checked of a genesis without the workload: its
// maker, the policy, the dataset plan and an empty ledger. (The initial parameters are the
// maker's choice, like a model's seed.)
func (v *validator) genesisAcceptable(from string, h *chain.Head, warn bool) bool {
	vs := slices.Clone(v.Validators)
	slices.Sort(vs)
	want := round.GenesisLedger(v.PlanID, len(v.Plan.Shards))
	why := ""
	switch {
	case from != vs[0]:
		why = "genesis from a validator that does not make it; ignoring"
	case h.Policy != v.Merger.Policy.Record():
		why = "genesis with another merge policy; not attesting"
	case h.Ledger.Plan != want.Plan || h.Ledger.Shards != want.Shards || lease.Count(h.Ledger) != 0 || h.Ledger.Epoch != 0:
		why = "genesis for another dataset plan; not attesting"
	}
	if why != "" && warn {
		v.Log.Warn(why, "from", from, "maker", vs[0], "policy", h.Policy, "plan", h.Ledger.Plan, "want_plan", want.Plan)
	}
	return why == ""
}

// startCheck checks c in a goroutine; its verdict arrives on checks.done.
func (v *validator) startCheck(ctx context.Context, c *check) {
	cctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	v.checks.running = c
	v.work.Go(func() {
		defer cancel()
		res := v.runCheck(cctx, c)
		select {
		case v.checks.done <- res:
		case <-ctx.Done():
		}
	})
}

// runCheck recomputes c's merge (not for genesis), within one round timeout, and fetches
// what the head needs: a genesis model over a slow link may take longer than that, and
// the artifact layer's stall detection bounds the fetch. It reads nothing the loop writes.
func (v *validator) runCheck(ctx context.Context, c *check) checkResult {
	res := checkResult{check: c}
	if c.base != nil {
		vctx, cancel := context.WithTimeout(ctx, v.Config.Lease.RoundTimeout)
		start := time.Now()
		res.err = v.verifyProposal(vctx, c.from, c.baseID, c.base, c.m, c.id)
		res.took = time.Since(start)
		cancel()
		if res.err != nil {
			return res
		}
	}
	hint, _ := peer.Decode(c.from)
	if err := v.FetchHead(ctx, c.h, hint); err != nil {
		res.err = fmt.Errorf("%w: %w", errNoArtifacts, err)
	}
	return res
}

// checkDone takes in the verdict on a proposal: the validator attests it if it passed and
// is still for the open round, with no other head signed for that round meanwhile. The
// next proposal waiting is checked then.
func (v *validator) checkDone(ctx context.Context, res checkResult) {
	v.checks.running = nil
	if res.took > 0 {
		v.mergeTook = res.took
	}
	v.settleCheck(ctx, res)
	for v.checks.running == nil && len(v.checks.queued) > 0 {
		q := v.checks.queued[0]
		v.checks.queued = v.checks.queued[1:]
		if c := v.checkable(q.from, q.m, false); c != nil {
			v.startCheck(ctx, c)
		}
	}
}

func (v *validator) settleCheck(ctx context.Context, res checkResult) {
	c := res.check
	now := v.checkable(c.from, c.m, false)
	if now == nil || !now.baseID.Equals(c.baseID) {
		return // the canonical head moved on, or this validator signed a head of the round meanwhile
	}
	switch {
	case errors.Is(res.err, context.Canceled):
		return // given up (settleChecks), not failed
	case errors.Is(res.err, errNoArtifacts):
		v.Log.Warn("cannot fetch the proposed head's artifacts; not attesting", "round", c.h.Round, "proposer", c.from, "err", res.err)
		return
	case res.err != nil:
		if errors.Is(res.err, round.ErrMismatch) || errors.Is(res.err, lease.ErrInvalid) {
			v.checks.refuted[c.id] = c.h.Round
		}
		v.Log.Warn("proposal failed verification; not attesting", "round", c.h.Round, "proposer", c.from, "head", c.id.String(), "err", res.err)
		v.Sink.Event("verify", "round %d: proposal %s by %s failed verification: %v", c.h.Round, cids.Short(c.id.String()), c.from, res.err)
		v.Sink.Rejected("bad_proposal")
		return
	}
	v.attest(ctx, c)
}

// verdict takes in a check's verdict in a phase of round: the hand-over to awaiting the
// quorum of the head this validator then signed for round, if it did.
func (v *validator) verdict(ctx context.Context, res checkResult, round uint64) *next {
	v.checkDone(ctx, res)
	if l, locked := v.locks[round]; locked {
		return awaiting(round, l)
	}
	return nil
}

// settleChecks waits until no check runs — for the verdicts on the proposals of the round
// after baseID, and for a check of a closed round to wind down — and says whether this
// validator signed one of them: a leader about to propose its own head of the round signs
// no second one, and runs no second merge beside a recomputation. It fails with
// errHeadMoved when the canonical head moves on meanwhile. It waits one recomputation's
// bound (lease.round_timeout) at most: then it cancels what still runs and drops what
// waits (a proposal that is re-published is checked again later).
func (v *validator) settleChecks(ctx context.Context, baseID cid.Cid, round uint64) (bool, error) {
	limit := time.NewTimer(v.Config.Lease.RoundTimeout)
	defer limit.Stop()
	for {
		changed := v.Tips.Changed()
		if cur, _ := v.Tips.Current(); !cur.Equals(baseID) {
			return false, errHeadMoved
		}
		if v.checks.running == nil {
			break
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-changed:
		case res := <-v.checks.done:
			v.checkDone(ctx, res)
		case <-limit.C:
			v.Log.Warn("proposals of the round still being checked after a round timeout; proposing without their verdict", "round", round)
			v.checks.queued = nil
			v.checks.running.cancel()
		}
	}
	_, locked := v.locks[round]
	return locked, nil
}

// attest signs a checked head, locks this validator to it for its round, stores it and
// publishes the attestation.
func (v *validator) attest(ctx context.Context, c *check) {
	sig, err := chain.Sign(v.Key, c.id)
	if err != nil {
		v.Log.Error("sign attestation", "err", err)
		return
	}
	m, h := c.m, c.h
	signed := chain.SignedHead{Head: m.Signed.Head, Sigs: slices.Clone(m.Signed.Sigs)}
	signed.Add(sig)
	if err := v.lock(h.Round, lockedHead{id: c.id, msg: &gossip.Head{Experiment: m.Experiment, Signed: signed, Notes: m.Notes, Proposal: m.Proposal}}); err != nil {
		v.Log.Error("not attesting: the signing lock cannot be recorded", "round", h.Round, "proposer", c.from, "err", err)
		v.Sink.Event("verify", "round %d: not attesting %s: %v", h.Round, cids.Short(c.id.String()), err)
		return
	}
	if err := v.Tips.SetNotes(c.id, h.Round, m.Notes); err != nil {
		v.Log.Warn("store round notes", "round", h.Round, "err", err)
	}
	if _, err := v.Tips.Offer(&signed); err != nil {
		v.Log.Warn("store attested head", "round", h.Round, "err", err)
	}
	v.Log.Info("attested head", "round", h.Round, "head", c.id.String(), "proposer", c.from)
	if err := v.Bus.Publish(ctx, &gossip.Attestation{Experiment: v.Config.Experiment.ID, Head: c.id.Bytes(), Round: h.Round, Sig: sig}); err != nil {
		v.Log.Warn("publish attestation", "round", h.Round, "err", err)
	}
}

// maxVerifyFetches bounds the updates a validator fetches at once to verify a proposal.
const maxVerifyFetches = 16

// verifyProposal recomputes a proposal: leases granted by the proposer on the right base,
// no replayed deltas, and the same merge result.
func (v *validator) verifyProposal(ctx context.Context, from string, baseID cid.Cid, base *chain.Head, m *gossip.Head, id cid.Cid) error {
	for _, l := range m.Proposal.Leases {
		if l.Issuer != from {
			return fmt.Errorf("%w: a lease for %s was issued by %s, not the proposer", lease.ErrInvalid, l.Trainer, l.Issuer)
		}
	}
	ref := cid.Undef
	if len(m.Proposal.Reference) > 0 {
		id, err := cid.Cast(m.Proposal.Reference)
		if err != nil {
			return fmt.Errorf("reference update: %w", err)
		}
		ref = id
	} else if v.RequireReference {
		return fmt.Errorf("the proposal names no reference update, and merge.screen.reference is on")
	}
	recent, merges := v.recentMerges(baseID)
	ahead := map[cid.Cid]bool{}
	for _, l := range m.Proposal.Leases {
		ahead[l.ID()] = l.Ahead(base)
	}
	cands := make([]round.Candidate, 0, len(m.Proposal.Candidates))
	for _, c := range m.Proposal.Candidates {
		delta, err := cid.Cast(c.Delta)
		if err != nil {
			return err
		}
		lid, err := cid.Cast(c.Lease)
		if err != nil {
			return err
		}
		if recent[delta] {
			return fmt.Errorf("delta %s of %s was merged in an earlier round", delta, c.Peer)
		}
		cands = append(cands, round.Candidate{Peer: c.Peer, Delta: delta, Lease: lid, Samples: c.Samples, Microshards: c.Microshards, Loss: c.Loss,
			Probation: round.OnProbation(merges, c.Peer), Sole: round.Sole(merges, c.Peer), Ahead: ahead[lid]})
	}
	// The updates are fetched side by side (one after another they took the sum of the
	// transfers), from the proposer as well as their trainers: the proposer holds every one
	// it merged, and a trainer's home uplink need not carry its update once per validator.
	var proposer []peer.ID
	if p, err := peer.Decode(from); err == nil && from != v.Self {
		proposer = append(proposer, p)
	}
	fetch, fctx := errgroup.WithContext(ctx)
	fetch.SetLimit(maxVerifyFetches)
	for _, c := range cands {
		hints := slices.Clone(proposer)
		if p, err := peer.Decode(c.Peer); err == nil {
			hints = append(hints, p)
		}
		fetch.Go(func() error {
			if err := v.Bus.Fetch(fctx, c.Delta, hints...); err != nil {
				return fmt.Errorf("fetch delta %s of %s: %w", c.Delta, c.Peer, err)
			}
			return nil
		})
	}
	if ref.Defined() {
		fetch.Go(func() error {
			if err := v.Bus.Fetch(fctx, ref, proposer...); err != nil {
				return fmt.Errorf("fetch reference update %s: %w", ref, err)
			}
			return nil
		})
		fetch.Go(func() error { return v.fetchBaseReference(fctx, base, proposer...) })
	}
	if err := fetch.Wait(); err != nil {
		return err
	}
	return v.Merger.Verify(ctx, baseID, base, m.Proposal.Leases, cands, ref, id)
}
