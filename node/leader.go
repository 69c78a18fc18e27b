package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
)

// Round timing of the leader.
const (
	minRoundDeadline = 3 * time.Second // the adaptive deadline never goes below this
	republishEvery   = 3 * time.Second // a proposal waiting for quorum is sent again
	replayWindow     = 64              // rounds back in which a merged delta counts as a replay
)

// openRound is the leader's state for the round it runs.
type openRound struct {
	round    uint64
	baseID   cid.Cid
	base     *chain.Head
	attempt  uint64
	leases   map[cid.Cid]lease.Lease // the current attempt's
	all      []lease.Lease           // every lease granted for the round (for the proposal)
	received map[string]received     // by trainer, across attempts
	deadline time.Time
	merged   map[cid.Cid]bool // deltas merged in recent rounds: a replay is rejected
	// unbenched: quarantined trainers were leased to this round (too few others).
	unbenched bool
}

type received struct {
	msg   *gossip.Contribution
	lease lease.Lease
	id    cid.Cid
}

// lead runs one round as its leader. firstAttempt separates the lease ids of a validator
// that took the round over from those of the leaders before it.
func (v *validator) lead(ctx context.Context, in *Inbox, baseID cid.Cid, base *chain.Head, firstAttempt uint64) error {
	if l, locked := v.locks[base.Round+1]; locked {
		// Already signed a head for this round (as a follower): see it through.
		return v.awaitQuorum(ctx, in, base.Round+1, l)
	}
	r := &openRound{round: base.Round + 1, baseID: baseID, base: base, attempt: firstAttempt,
		received: map[string]received{}, merged: v.recentDeltas(baseID)}
	changed := v.tips.Changed()
	start := time.Now()
	for {
		err := v.issue(ctx, in, r, changed)
		var closeNow bool
		if err == nil {
			closeNow, err = v.collect(ctx, in, r, changed)
		}
		if errors.Is(err, errLocked) {
			return v.awaitQuorum(ctx, in, r.round, v.locks[r.round])
		}
		if err != nil {
			return err
		}
		if !closeNow {
			r.attempt++
			continue
		}
		proposal, err := v.propose(ctx, r, time.Since(start))
		if err != nil {
			return err
		}
		if proposal == nil {
			r.attempt++
			continue
		}
		return v.awaitQuorum(ctx, in, r.round, *proposal)
	}
}

// recentDeltas returns the delta artifacts merged in the last replayWindow heads.
func (v *validator) recentDeltas(from cid.Cid) map[cid.Cid]bool {
	out := map[cid.Cid]bool{}
	n := 0
	_ = v.heads.Walk(from, func(_ cid.Cid, h *chain.Head) error {
		for _, c := range h.Contributions {
			if id, err := cid.Cast(c.Artifact); err == nil {
				out[id] = true
			}
		}
		if n++; n >= replayWindow {
			return errStopped
		}
		return nil
	})
	return out
}

// issue waits for enough live trainers and grants leases for the round's next attempt.
func (v *validator) issue(ctx context.Context, in *Inbox, r *openRound, changed <-chan struct{}) error {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	waitingSince := time.Now()
	for {
		taken := map[uint32]bool{}
		for _, rc := range r.received {
			for _, s := range rc.msg.Microshards {
				taken[s] = true
			}
		}
		var avail []uint32
		for _, s := range lease.Available(r.base.Ledger) {
			if !taken[s] {
				avail = append(avail, s)
			}
		}
		var open []lease.Trainer
		for _, t := range v.trainers.live() {
			if _, done := r.received[t.Peer]; !done {
				open = append(open, t)
			}
		}
		cands, relaxed := v.quarantine.Eligible(open, r.round, len(r.received), v.cfg.Lease.MinGroup)
		heard := time.Since(v.started) > announceEvery+250*time.Millisecond
		if relaxed && heard && !r.unbenched {
			r.unbenched = true
			q := len(v.quarantine.List(r.round))
			v.log.Warn("too few trainers outside quarantine: leasing to quarantined peers this round", "round", r.round,
				"available", len(open), "quarantined", q, "min_group", v.cfg.Lease.MinGroup)
			v.status.event("quarantine", "round %d: too few trainers outside quarantine; leasing to the %d quarantined too", r.round, q)
		}
		if heard && len(cands) > 0 && len(avail) > 0 && len(cands)+len(r.received) >= v.cfg.Lease.MinGroup {
			return v.grant(ctx, r, avail, cands)
		}
		if time.Since(waitingSince) > 10*time.Second {
			v.log.Info("waiting for trainers", "round", r.round, "live", len(cands), "min_group", v.cfg.Lease.MinGroup)
			waitingSince = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
			return errHeadMoved
		case a := <-in.Announces:
			v.trainers.seen(a.From, a.Msg)
		case h := <-in.Heads:
			v.verifyAndAttest(ctx, h.From, h.Msg)
			if _, locked := v.locks[r.round]; locked {
				return errLocked
			}
		case <-tick.C:
		}
	}
}

func (v *validator) grant(ctx context.Context, r *openRound, avail []uint32, cands []lease.Trainer) error {
	// The data order depends on the model state (its parameters) and the attempt, not on the
	// head's id, whose lease records carry wall-clock expiries: equal models get equal leases.
	seed := append(slices.Clone(r.base.Params), byte(r.base.Round), byte(r.base.Round>>8), byte(r.attempt), byte(r.attempt>>8))
	plan := lease.Assign(avail, cands, v.cfg.Lease.MicroshardsPerTrainer, seed)
	steps := lease.Steps(cands, v.cfg.Protocol.InnerSteps)
	peers := make([]string, 0, len(plan))
	for p := range plan {
		peers = append(peers, p)
	}
	sort.Strings(peers)
	var pace []lease.Pace
	for _, p := range peers {
		pace = append(pace, lease.Pace{Peer: p, SecondsPerStep: v.paces.get(p), Steps: steps[p]})
	}
	r.deadline = time.Now().Add(lease.Deadline(pace, min(minRoundDeadline, v.cfg.Lease.RoundTimeout), v.cfg.Lease.RoundTimeout))
	msg := &gossip.Leases{Experiment: v.cfg.Experiment.ID, Round: r.round, Base: r.baseID.Bytes(), Issuer: v.self,
		Deadline: r.deadline.UnixMilli(), Attempt: r.attempt}
	r.leases = map[cid.Cid]lease.Lease{}
	leased := map[string]int{}
	for _, p := range peers {
		l := lease.Lease{Round: r.round, Base: r.baseID.Bytes(), Trainer: p, Microshards: plan[p],
			Expiry: r.deadline.UnixMilli(), Issuer: v.self, Epoch: r.base.Ledger.Epoch, Steps: uint32(steps[p])}
		r.leases[l.ID()] = l
		r.all = append(r.all, l)
		msg.Leases = append(msg.Leases, l)
		leased[p] = len(l.Microshards)
	}
	v.status.update(func(s *Status) {
		q := v.quarantine.List(r.round)
		s.Validator = &ValidatorStatus{Round: r.round, Attempt: r.attempt, Leased: leased, Deadline: r.deadline, Trainers: len(cands), Quarantined: q}
	})
	v.log.Info("issued leases", "round", r.round, "attempt", r.attempt, "trainers", len(peers), "deadline", time.Until(r.deadline).Round(time.Millisecond).String())
	return v.bus.Publish(ctx, msg)
}

// collect gathers contributions for the current attempt. It returns true when the round
// should close (everyone reported, or the deadline passed with the minimum group) and false
// when the round must be leased again.
func (v *validator) collect(ctx context.Context, in *Inbox, r *openRound, changed <-chan struct{}) (bool, error) {
	timer := time.NewTimer(time.Until(r.deadline))
	defer timer.Stop()
	for {
		if v.allReported(r) {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-changed:
			return false, errHeadMoved
		case a := <-in.Announces:
			v.trainers.seen(a.From, a.Msg)
		case h := <-in.Heads:
			v.verifyAndAttest(ctx, h.From, h.Msg)
			if _, locked := v.locks[r.round]; locked {
				return false, errLocked
			}
		case c := <-in.Contributions:
			v.accept(ctx, r, c.From, c.Msg)
		case <-timer.C:
			v.reportMissing(r)
			if len(r.received) >= v.cfg.Lease.MinGroup {
				return true, nil
			}
			v.log.Warn("round deadline passed without the minimum group; leasing again", "round", r.round, "received", len(r.received), "min_group", v.cfg.Lease.MinGroup)
			v.status.event("release", "round %d: deadline passed with %d of %d contributions; leasing again", r.round, len(r.received), v.cfg.Lease.MinGroup)
			return false, nil
		}
	}
}

// reportMissing says which leased trainers did not report by the deadline: their
// microshards go back to the pool.
func (v *validator) reportMissing(r *openRound) {
	for _, l := range r.leases {
		if _, ok := r.received[l.Trainer]; !ok {
			v.log.Warn("trainer did not report by the deadline; its microshards return to the pool", "round", r.round, "peer", l.Trainer, "microshards", len(l.Microshards))
			v.status.event("missing", "round %d: %s did not report by the deadline; its %d microshards return to the pool", r.round, l.Trainer, len(l.Microshards))
		}
	}
}

func (v *validator) allReported(r *openRound) bool {
	if len(r.leases) == 0 {
		return false
	}
	for _, l := range r.leases {
		if _, ok := r.received[l.Trainer]; !ok {
			return false
		}
	}
	return true
}

// accept checks a contribution against the leases of the open round and fetches its delta.
func (v *validator) accept(ctx context.Context, r *openRound, from string, c *gossip.Contribution) {
	reject := func(reason, format string, args ...any) { v.rejected(from, r.round, reason, sprintf(format, args...)) }
	if c.Round != r.round || !slices.Equal(c.Base, r.baseID.Bytes()) {
		if c.Round < r.round {
			return // late for a closed round: nothing to do
		}
		reject("wrong_base", "for round %d on another base, open round is %d", c.Round, r.round)
		return
	}
	if c.Peer != from {
		reject("forged_peer", "message from %s claims peer %s", from, c.Peer)
		return
	}
	leaseID, err := cid.Cast(c.Lease)
	if err != nil {
		reject("no_lease", "lease id: %v", err)
		return
	}
	l, ok := r.leases[leaseID]
	if !ok || l.Trainer != from {
		if slices.ContainsFunc(r.all, func(x lease.Lease) bool { return x.ID().Equals(leaseID) && x.Trainer == from }) {
			reject("late", "lease %s expired with an earlier attempt", leaseID)
		} else {
			reject("no_lease", "lease %s was not granted to %s", leaseID, from)
		}
		return
	}
	if !slices.Equal(l.Microshards, c.Microshards) {
		reject("lease_mismatch", "microshards differ from the lease")
		return
	}
	if _, dup := r.received[from]; dup {
		reject("replay", "second contribution for round %d", r.round)
		return
	}
	delta, err := cid.Cast(c.Delta)
	if err != nil {
		reject("malformed", "delta id: %v", err)
		return
	}
	if r.merged[delta] {
		reject("replay", "delta %s was merged in an earlier round", delta)
		return
	}
	hint, _ := peer.Decode(from)
	// A holder that stalls must not hold the round past its deadline.
	fctx, cancel := context.WithDeadline(ctx, r.deadline)
	defer cancel()
	if err := v.bus.Fetch(fctx, delta, hint); err != nil || !v.store.Has(delta) {
		reject("unavailable", "fetch delta %s: %v", delta, err)
		return
	}
	steps := int(l.Steps)
	if steps == 0 {
		steps = v.cfg.Protocol.InnerSteps
	}
	v.paces.observe(from, c.Seconds, steps)
	r.received[from] = received{msg: c, lease: l, id: leaseID}
	v.status.update(func(s *Status) {
		if s.Validator != nil {
			s.Validator.Received = append(s.Validator.Received, from)
		}
	})
}

// propose merges what was received and publishes the proposal (nil: nothing survived
// screening, lease again).
func (v *validator) propose(ctx context.Context, r *openRound, took time.Duration) (*lockedHead, error) {
	cands := make([]round.Candidate, 0, len(r.received))
	var wire []gossip.Candidate
	for p, rc := range r.received {
		delta, _ := cid.Cast(rc.msg.Delta)
		cands = append(cands, round.Candidate{Peer: p, Delta: delta, Lease: rc.id, Samples: rc.msg.Samples,
			Microshards: rc.msg.Microshards, Loss: rc.msg.Loss})
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].Peer < cands[j].Peer })
	var leases []lease.Lease
	for _, c := range cands {
		wire = append(wire, gossip.Candidate{Peer: c.Peer, Delta: c.Delta.Bytes(), Lease: c.Lease.Bytes(), Samples: c.Samples,
			Microshards: c.Microshards, Loss: c.Loss})
		leases = append(leases, r.received[c.Peer].lease)
	}
	out, err := v.merger.Merge(ctx, r.baseID, r.base, cands)
	rejected := map[string]string{}
	if out != nil {
		for _, rj := range out.Rejected {
			v.rejected(rj.Peer, r.round, rj.Reason, rj.Detail)
			rejected[rj.Peer] = rj.Reason
			delete(r.received, rj.Peer)
		}
	}
	v.status.update(func(s *Status) {
		if s.Validator != nil {
			s.Validator.Rejected = rejected
		}
	})
	if errors.Is(err, round.ErrNothingMerged) {
		v.status.event("release", "round %d: no contribution passed screening; leasing again", r.round)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sh, err := v.sign(out.Head)
	if err != nil {
		return nil, err
	}
	metrics := v.evaluate(ctx, out.Head)
	v.tips.SetMetrics(out.ID, metrics)
	msg := &gossip.Head{Experiment: v.cfg.Experiment.ID, Signed: *sh, Metrics: metrics,
		Proposal: &gossip.Proposal{Attempt: r.attempt, Leases: leases, Candidates: wire}}
	lk := lockedHead{id: out.ID, msg: msg}
	v.locks[r.round] = lk
	if _, err := v.tips.Offer(sh); err != nil {
		return nil, err
	}
	v.metrics.roundClosed(took, len(out.Head.Contributions))
	v.log.Info("proposed head", "round", r.round, "head", out.ID.String(), "merged", len(out.Head.Contributions),
		"rejected", len(out.Rejected), "took", took.Round(time.Millisecond).String())
	if err := v.bus.Publish(ctx, msg); err != nil {
		return nil, fmt.Errorf("publish proposal: %w", err)
	}
	return &lk, nil
}

// awaitQuorum keeps a signed proposal in circulation until the canonical head moves on
// (quorum reached here or elsewhere): a validator that has signed a head for a round signs
// no other.
func (v *validator) awaitQuorum(ctx context.Context, in *Inbox, round uint64, l lockedHead) error {
	t := time.NewTicker(republishEvery)
	defer t.Stop()
	for {
		changed := v.tips.Changed()
		if _, h := v.tips.Current(); h != nil && h.Round >= round {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case a := <-in.Announces:
			v.trainers.seen(a.From, a.Msg)
		case h := <-in.Heads:
			v.verifyAndAttest(ctx, h.From, h.Msg)
		case <-t.C:
			msg := *l.msg
			if sh, _, err := v.heads.Get(l.id); err == nil {
				msg.Signed = *sh // with every signature gathered so far
			}
			msg.Sent = time.Now().UnixMilli()
			if err := v.bus.Publish(ctx, &msg); err != nil {
				v.log.Debug("re-publish proposal", "round", round, "err", err)
			}
		}
	}
}
