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

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
)

// Failover timing (exported for the node's cluster tests): a follower expects leases
// within LeaseWait of a new head, and a proposal within LeaseGrace after the leases'
// deadline; the k-th validator in the order takes over (k-1) × TakeoverStep after that,
// so they do not all jump in at once.
//
// A leader that is heard but gets nowhere — cut off from every peer but one, its leases
// and heartbeats still arrive by gossip through that link while it cannot fetch a single
// contribution — keeps the silence timer from ever firing. So the validator that leads
// the round has stuckRounds round timeouts (lease.round_timeout) to bring a head to
// quorum; after that it is passed over like a silent one, in the same order. Each attempt
// of a leader lasts at most one round timeout, so a leader that works needs one, and two
// leave it a retry.
const (
	LeaseWait    = 3 * time.Second
	LeaseGrace   = time.Second
	TakeoverStep = time.Second
	stuckRounds  = 2
)

// errLocked means this validator signed another validator's proposal for the round it was
// leading: it follows that proposal instead of making its own.
var errLocked = errors.New("signed another proposal for this round")

// follow is a validator's round when it is not the leader: it verifies and attests
// proposals, and takes the round over when the validators ahead of it stay silent.
func (v *validator) follow(ctx context.Context, in *bus.Inbox, baseID cid.Cid, base *chain.Head, rank int, order []string) error {
	v.enter(PhaseFollowing, base.Round+1)
	r := base.Round + 1
	if l, locked := v.locks[r]; locked {
		return v.awaitQuorum(ctx, in, r, l)
	}
	changed := v.Tips.Changed()
	if cur, _ := v.Tips.Current(); !cur.Equals(baseID) {
		return errHeadMoved // before changed was taken: it would not fire for that move
	}
	expect := time.Now().Add(LeaseWait) // when a validator ahead must have shown progress by
	if !v.signedByAll(baseID, order[:rank]) {
		// A validator ahead has not signed the base here: it may still be recomputing the
		// base's merge, and it cannot lead before it has. This validator's own last merge
		// tells how long that takes (twice, for a slower machine); its attestation, when it
		// comes, restarts the clock (waiting).
		expect = expect.Add(min(2*v.mergeTook, v.Config.Lease.RoundTimeout))
	}
	silentAt := func() time.Time { return expect.Add(time.Duration(rank-1) * TakeoverStep) }
	// active is the rank of the validator ahead that leads the round now (a takeover
	// restarts the clock); stuckAt is when it will have had its stuckRounds round timeouts.
	active, stuckAt := 0, time.Now().Add(stuckRounds*v.Config.Lease.RoundTimeout)
	passOver := v.canPassOverHeardLeader()
	takeoverAt := func() time.Time {
		at := silentAt()
		if s := stuckAt.Add(time.Duration(rank-active-1) * TakeoverStep); passOver && s.Before(at) {
			at = s
		}
		return at
	}
	timer := time.NewTimer(time.Until(takeoverAt()))
	defer timer.Stop()
	reset := func() {
		timer.Stop()
		timer = time.NewTimer(time.Until(takeoverAt()))
	}
	ahead := order[:rank]
	// granted: the validator leading the round granted leases in it (not only heartbeats).
	granted := false
	// lastHeard is when the last grant or heartbeat of a validator ahead was read (zero:
	// none yet), for the takeover's log line: it tells a leader that fell silent from
	// beats that arrived late (a starved process).
	var lastHeard time.Time
	// heard takes in a grant or heartbeat of a validator ahead.
	heard := func(l bus.Received[gossip.Leases]) {
		v.recordGrant(l)
		if l.Msg.Round != r || !slices.Equal(l.Msg.Base, baseID.Bytes()) || !slices.Contains(ahead, l.From) {
			return
		}
		lastHeard = time.Now()
		if k := slices.Index(order, l.From); k > active {
			// A validator ahead took the round over: it gets its own time.
			active, stuckAt, granted = k, time.Now().Add(stuckRounds*v.Config.Lease.RoundTimeout), false
			reset()
		}
		if len(l.Msg.Leases) > 0 && l.From == order[active] {
			granted = true
		}
		if d := time.UnixMilli(l.Msg.Deadline).Add(LeaseGrace); d.After(expect) {
			expect = d
			reset()
		}
	}
	// waiting takes in a validator ahead that has only now reached the base: it re-publishes
	// the base's proposal (still gathering its quorum) or has just attested it. With a
	// quorum of two, the first attester has the quorum one gossip hop before the proposer,
	// and the proposer before the validators still recomputing the merge; under load each
	// has taken seconds. The leader is not silent, it did not know yet: its time starts now.
	waiting := func() {
		lastHeard = time.Now()
		if d := time.Now().Add(LeaseWait); d.After(expect) {
			expect = d
			reset()
		}
	}
	// attested takes in an attestation: one of the base by a validator ahead means it has
	// verified the base and can lead now.
	attested := func(a bus.Received[gossip.Attestation]) {
		if slices.Contains(ahead, a.From) && slices.Equal(a.Msg.Head, baseID.Bytes()) {
			waiting()
		}
	}
	// onHead takes in a head: the base re-published by a validator ahead, or a proposal
	// for this round to verify and attest; it returns the lock when this validator signed.
	onHead := func(h bus.Received[gossip.Head]) (lockedHead, bool) {
		if baseStillOpen(h, baseID, ahead) {
			waiting()
			return lockedHead{}, false
		}
		v.verifyAndAttest(ctx, h.From, h.Msg)
		l, locked := v.locks[r]
		return l, locked
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
			return errHeadMoved
		case a := <-in.Announces:
			v.trainers.seen(a.From, a.Msg)
			if v.waitingForFleet(granted) {
				stuckAt = time.Now().Add(stuckRounds * v.Config.Lease.RoundTimeout)
			}
		case c := <-in.Contributions:
			v.noteSpeed(c.From, c.Msg)
			v.noteReport(c.From, c.Msg, r)
		case l := <-in.Leases:
			heard(l)
		case a := <-in.Attestations:
			attested(a)
		case h := <-in.Heads:
			if l, locked := onHead(h); locked {
				return v.awaitQuorum(ctx, in, r, l)
			}
		case <-timer.C:
			// Grants, heartbeats, attestations and re-published proposals queued while this
			// loop was busy (verifying a proposal, or starved of CPU) come first: a leader is
			// silent only if nothing of it arrived, not because nothing was read.
			for drained := false; !drained; {
				select {
				case l := <-in.Leases:
					heard(l)
				case a := <-in.Attestations:
					attested(a)
				case h := <-in.Heads:
					if l, locked := onHead(h); locked {
						return v.awaitQuorum(ctx, in, r, l)
					}
				default:
					drained = true
				}
			}
			if time.Now().Before(takeoverAt()) {
				reset()
				continue
			}
			if len(v.trainers.live()) == 0 {
				// Nothing to lead without trainers.
				expect = time.Now().Add(LeaseWait)
				if stuckAt.Before(expect) {
					stuckAt = expect
				}
				reset()
				continue
			}
			if time.Now().Before(silentAt()) && v.waitingForFleet(granted) {
				stuckAt = time.Now().Add(stuckRounds * v.Config.Lease.RoundTimeout)
				reset()
				continue
			}
			if time.Now().Before(silentAt()) {
				v.Log.Warn("the leader is heard but has brought no head to quorum; taking the round over", "round", r, "rank", rank,
					"leader", order[active], "waited", (stuckRounds * v.Config.Lease.RoundTimeout).String())
				v.Sink.Event("takeover", "round %d: %s was heard but brought no head to quorum in %d round timeouts; taking the round over (rank %d)",
					r, order[active], stuckRounds, rank)
			} else {
				lastAgo := "never"
				if !lastHeard.IsZero() {
					lastAgo = time.Since(lastHeard).Round(time.Millisecond).String()
				}
				v.Log.Warn("the validators ahead are silent; taking the round over", "round", r, "rank", rank, "leader", order[0],
					"last_heard_ago", lastAgo, "late_by", time.Since(silentAt()).Round(time.Millisecond).String())
				v.Sink.Event("takeover", "round %d: %s was silent; taking the round over (rank %d)", r, order[0], rank)
			}
			return v.lead(ctx, in, baseID, base, uint64(rank)<<16)
		}
	}
}

// signedByAll says whether every validator in vs has signed the head id as this validator
// holds it (its own signature and those gathered by gossip so far).
func (v *validator) signedByAll(id cid.Cid, vs []string) bool {
	sh, _, err := v.Heads.Get(id)
	if err != nil {
		return false
	}
	for _, p := range vs {
		if chain.FindSignature(sh.Sigs, p) == nil {
			return false
		}
	}
	return true
}

// maxVerifyFetches bounds the updates a validator fetches at once to verify a proposal.
const maxVerifyFetches = 16

// baseStillOpen says whether h is the base's proposal re-published by a validator ahead:
// that validator has not seen the base reach its quorum yet (awaitQuorum re-publishes it
// with the signatures gathered so far; head sync sends this validator's attestation again
// when it is missing).
func baseStillOpen(h bus.Received[gossip.Head], baseID cid.Cid, ahead []string) bool {
	return slices.Contains(ahead, h.From) && h.Msg.Signed.ID().Equals(baseID)
}

// waitingForFleet says whether a heard leader that has granted nothing in the round is
// right to wait: this validator, too, hears fewer trainers than a minimum group, so no other
// leader could start the round either. Its stuck clock (stuckRounds round timeouts) then
// counts only from when enough trainers are heard.
func (v *validator) waitingForFleet(granted bool) bool {
	return !granted && len(v.trainers.live()) < v.Config.Lease.MinGroup
}

// canPassOverHeardLeader says whether a follower may take over from a leader that is still
// heard: only when the quorum is a majority (two heads of one round can then never both
// reach it, whoever proposes them) and the other validators can reach it without the
// leader. With two validators and quorum 2, say, a takeover could only leave both locked
// to their own proposals, and the round would never close.
func (v *validator) canPassOverHeardLeader() bool {
	n, q := len(v.Validators), v.Config.Experiment.Quorum
	return 2*q > n && n-1 >= q
}

// verifyAndAttest checks another validator's proposal for the round after the canonical
// head by recomputing it, and signs it when it matches and this validator has signed no
// other head for that round.
func (v *validator) verifyAndAttest(ctx context.Context, from string, m *gossip.Head) {
	if m.Proposal == nil || from == v.Self || !v.isValidator(from) {
		return
	}
	h, err := m.Signed.Decode()
	if err != nil {
		return
	}
	baseID, base := v.Tips.Current()
	id := m.Signed.ID()
	if h.Round == 0 {
		if base == nil {
			v.attestGenesis(ctx, from, m, h, id)
		}
		return
	}
	if base == nil || h.Round != base.Round+1 || !slices.Equal(h.Parent, baseID.Bytes()) {
		return // not for the open round; head sync deals with heads of other rounds
	}
	if l, locked := v.locks[h.Round]; locked {
		if !l.id.Equals(id) {
			v.Log.Info("not attesting a second head for the round", "round", h.Round, "proposer", from, "signed", l.id.String())
		}
		return
	}
	vctx, cancel := context.WithTimeout(ctx, v.Config.Lease.RoundTimeout)
	defer cancel()
	verifyStart := time.Now()
	err = v.verifyProposal(vctx, from, baseID, base, m, id)
	v.mergeTook = time.Since(verifyStart)
	if err != nil {
		v.Log.Warn("proposal failed verification; not attesting", "round", h.Round, "proposer", from, "head", id.String(), "err", err)
		v.Sink.Event("verify", "round %d: proposal %s by %s failed verification: %v", h.Round, cids.Short(id.String()), from, err)
		v.Sink.Rejected("bad_proposal")
		return
	}
	v.signAndAttest(ctx, from, m, h, id)
}

// attestGenesis signs the genesis proposed by the validator that makes it, after checking
// what can be checked without the workload: the policy, the dataset plan and an empty
// ledger. (The initial parameters are the maker's choice, like a model's seed.)
func (v *validator) attestGenesis(ctx context.Context, from string, m *gossip.Head, h *chain.Head, id cid.Cid) {
	vs := slices.Clone(v.Validators)
	slices.Sort(vs)
	want := round.GenesisLedger(v.PlanID, len(v.Plan.Shards))
	switch {
	case from != vs[0]:
		v.Log.Warn("genesis from a validator that does not make it; ignoring", "from", from, "maker", vs[0])
		return
	case h.Policy != v.Merger.Policy.Record():
		v.Log.Warn("genesis with another merge policy; not attesting", "from", from, "policy", h.Policy)
		return
	case h.Ledger.Plan != want.Plan || h.Ledger.Shards != want.Shards || lease.Count(h.Ledger) != 0 || h.Ledger.Epoch != 0:
		v.Log.Warn("genesis for another dataset plan; not attesting", "from", from, "plan", h.Ledger.Plan, "want", want.Plan)
		return
	}
	if _, locked := v.locks[0]; locked {
		return
	}
	v.signAndAttest(ctx, from, m, h, id)
}

// signAndAttest signs a verified head, locks this validator to it for its round, stores it
// and publishes the attestation.
func (v *validator) signAndAttest(ctx context.Context, from string, m *gossip.Head, h *chain.Head, id cid.Cid) {
	hint, _ := peer.Decode(from)
	if err := v.FetchHead(ctx, h, hint); err != nil {
		v.Log.Warn("cannot fetch the proposed head's artifacts; not attesting", "round", h.Round, "proposer", from, "err", err)
		return
	}
	sig, err := chain.Sign(v.Key, id)
	if err != nil {
		v.Log.Error("sign attestation", "err", err)
		return
	}
	signed := chain.SignedHead{Head: m.Signed.Head, Sigs: slices.Clone(m.Signed.Sigs)}
	signed.Add(sig)
	if err := v.lock(h.Round, lockedHead{id: id, msg: &gossip.Head{Experiment: m.Experiment, Signed: signed, Notes: m.Notes, Proposal: m.Proposal}}); err != nil {
		v.Log.Error("not attesting: the signing lock cannot be recorded", "round", h.Round, "proposer", from, "err", err)
		v.Sink.Event("verify", "round %d: not attesting %s: %v", h.Round, cids.Short(id.String()), err)
		return
	}
	if err := v.Tips.SetNotes(id, h.Round, m.Notes); err != nil {
		v.Log.Warn("store round notes", "round", h.Round, "err", err)
	}
	if _, err := v.Tips.Offer(&signed); err != nil {
		v.Log.Warn("store attested head", "round", h.Round, "err", err)
	}
	v.Log.Info("attested head", "round", h.Round, "head", id.String(), "proposer", from)
	if err := v.Bus.Publish(ctx, &gossip.Attestation{Experiment: v.Config.Experiment.ID, Head: id.Bytes(), Round: h.Round, Sig: sig}); err != nil {
		v.Log.Warn("publish attestation", "round", h.Round, "err", err)
	}
}

// verifyProposal recomputes a proposal: leases granted by the proposer on the right base,
// no replayed deltas, and the same merge result.
func (v *validator) verifyProposal(ctx context.Context, from string, baseID cid.Cid, base *chain.Head, m *gossip.Head, id cid.Cid) error {
	for _, l := range m.Proposal.Leases {
		if l.Issuer != from {
			return fmt.Errorf("%w: a lease for %s was issued by %s, not the proposer", lease.ErrInvalid, l.Trainer, l.Issuer)
		}
	}
	recent, merges := v.recentMerges(baseID)
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
			Probation: OnProbation(merges, c.Peer), Sole: Sole(merges, c.Peer)})
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
	if err := fetch.Wait(); err != nil {
		return err
	}
	return v.Merger.Verify(ctx, baseID, base, m.Proposal.Leases, cands, id)
}
