package validator

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/round"
)

// The leader's issuing phase: what the round's book says to do next, the grant of an
// attempt's leases, the heartbeat while it waits, and the recent merges the grant and the
// screening read of the chain.

// issueStep is what the round's book says to do now (step), with the microshards available,
// the trainers that may be leased (relaxed: quarantined ones among them, too few others),
// and how many trainers are live, open to a lease, barred from the round, not reached by a
// grant yet and catching up.
type issueStep struct {
	step               lease.Step
	avail              []uint32
	cands              []lease.Trainer
	live, open, barred int
	unreached          int // live trainers heard anew that a grant does not reach yet
	behind             int // live trainers still catching up
	relaxed            bool
}

func (p *leadPhase) nextStep() issueStep {
	v, r := p.v, p.r
	taken := r.ofUpdates(func(rc received) []uint32 { return rc.msg.Microshards }, false)
	reserved := r.reservedNow()
	var st issueStep
	for _, s := range lease.Available(r.base.Ledger) {
		if !taken[s] && !reserved[s] {
			st.avail = append(st.avail, s)
		}
	}
	live := v.trainers.live()
	barred := r.book.Barred()
	for i, t := range live {
		// Proven: merged recently, with no rejection or missed lease in the quarantine's
		// window. A drifting attacker is merged until the bar catches it; its rejected
		// microshards return to the pool, and served first it took five of the six an
		// epoch's tail had (docs/security.md).
		live[i].Proven = r.merges[t.Peer] > 0 && !v.quarantine.Struck(t.Peer, r.round)
		if barred[t.Peer] != "" {
			st.barred++
		}
	}
	open := r.book.Candidates(live)
	// A grant goes to the trainers it reaches. One heard through another peer before its own
	// connection or subscription to the leases topic is in (just started or restarted, or
	// back after a cut) would miss the grant, published once, and wait out the attempt:
	// gossip forwards nothing to a peer that joins a topic's mesh after the message passed.
	// It is leased once its subscription is in, a tick later, or once it has been in the
	// meshes for reachGrace (a trainer that cannot hold a connection to this leader, behind
	// NAT, gets the grant forwarded). Nor does a grant go to a joiner that holds no head
	// yet (trainerSeen.behind), until it announces one.
	reach := v.Bus.Reach(&gossip.Leases{})
	open = slices.DeleteFunc(open, func(t lease.Trainer) bool {
		switch {
		case !reach(t.Peer) && v.trainers.backFor(t.Peer) < reachGrace:
			st.unreached++
		case v.trainers.isBehind(t.Peer):
			st.behind++
		default:
			return false
		}
		return true
	})
	st.live, st.open = len(live), len(open)
	st.cands, st.relaxed = v.quarantine.Eligible(open, r.round, len(r.received), v.Config.Lease.MinGroup)
	if r.book.Lone() {
		st.cands = lease.OneOf(st.cands)
	}
	// A (re)started leader leases nothing before it has heard the fleet announce, nor while
	// it checks another validator's proposal of the round (it follows that one if it
	// passes: its trainers' work on new leases would be lost), for one recomputation's
	// bound at most (checks.holdBack).
	st.step = lease.Wait
	checking := v.checks.holdBack(r.round, &p.checking, v.Config.Lease.RoundTimeout)
	if time.Since(v.started) > gossip.AnnounceEvery+250*time.Millisecond && !checking {
		st.step = r.book.Next(time.Now(), lease.Situation{Received: len(r.received), MinGroup: v.Config.Lease.MinGroup,
			Candidates: len(st.cands), Barred: st.barred, Available: len(st.avail), Patience: max(r.window, v.Config.Lease.MinDeadline)})
	}
	if st.step == lease.Grant && v.joining(r) {
		st.step = lease.Wait
	}
	return st
}

// reachGrace is how long a trainer heard anew is not leased while this leader's pubsub does
// not list it among the leases topic's subscribers (nextStep): an announcement period, by
// which its subscription has reached its neighbours and their meshes have taken it in (a
// GossipSub heartbeat is a second).
const reachGrace = gossip.AnnounceEvery

// joinGrace is how long a young chain's leader waits, before its round's first grant,
// after the last trainer it heard for the first time: trainers started together are heard
// one by one, each within an announcement period of its start, and a round leased to the
// first one heard is trained by that one alone (an attacker started first would have the
// opening to itself). joinWaitMax bounds the wait of one round.
const (
	joinGrace   = gossip.AnnounceEvery + 250*time.Millisecond
	joinWaitMax = 2 * joinGrace
)

// joining says whether the round's first grant waits for trainers still joining: in a
// young chain (the first round.TrustMerges rounds), while a trainer was first heard within
// joinGrace, until joinWaitMax after the first live trainer was heard at most.
func (v *validator) joining(r *openRound) bool {
	if r.granted || r.round > round.TrustMerges {
		return false
	}
	first, last := v.trainers.joined()
	return !last.IsZero() && time.Since(last) < joinGrace && time.Since(first) < joinWaitMax
}

func (v *validator) recentMerges(from cid.Cid) (map[cid.Cid]bool, map[string]int) {
	return v.Heads.RecentMerges(from, replayWindow)
}

// heartbeat publishes, every heartbeatEvery until stop is called, an empty grant of the
// round with a deadline 2 × heartbeatEvery ahead: a follower that hears it expects the
// leader's next sign of life by then (plus LeaseGrace), so it does not take the round over
// from a leader that waits (for a minimum group, a backoff, contributions) or merges. The
// deadline moves with every beat, so no two beats are the same message (gossip drops a
// repeat). Trainers ignore a grant without a lease for them.
func (v *validator) heartbeat(ctx context.Context, r *openRound) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	round, base, first := r.round, r.baseID.Bytes(), r.attempt
	go func() {
		defer close(done)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			hb := &gossip.Leases{Experiment: v.Config.Experiment.ID, Round: round, Base: base, Issuer: v.Self,
				Deadline: time.Now().Add(2 * heartbeatEvery).UnixMilli(), Attempt: first}
			if err := v.Bus.Publish(ctx, hb); err != nil && ctx.Err() == nil {
				v.Log.Debug("publish heartbeat", "round", round, "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

func (v *validator) grant(ctx context.Context, r *openRound, avail []uint32, cands []lease.Trainer) error {
	if r.granted {
		r.attempt++
	}
	r.granted = true
	// The data order depends on the model state (its parameters) and the attempt, not on the
	// head's id, whose lease records carry wall-clock expiries: equal models get equal leases.
	seed := append(slices.Clone(r.base.Params), byte(r.base.Round), byte(r.base.Round>>8), byte(r.attempt), byte(r.attempt>>8))
	work := workCandidates(cands, v.Config.Protocol.SpeedProportional)
	// The round's proposal lists every received contribution's microshards: a later attempt
	// leases only what is left of the round's bound, so the proposal fits its message.
	budget := lease.MaxRoundMicroshards
	for _, rc := range r.received {
		budget -= len(rc.msg.Microshards) + len(rc.lease.Next)
	}
	// A trainer's share holds a window's samples where the epoch allows it, so a window does
	// not loop over its examples (window.go).
	share := v.windowShare(len(work))
	// Trainers that trained their reservation ahead get it (overlap.go); the others share
	// what is left.
	plan, steps, rest, others := honour(v.reservations(r), avail, work, budget)
	for _, ms := range plan {
		budget -= len(ms)
	}
	// The epoch's last full round takes a leftover of up to half a round with it, in
	// longer windows, rather than leave it to a round of short ones.
	fresh := lease.AssignWithin(rest, others, lease.AbsorbTail(len(rest), others, share), budget, seed)
	// Windows run as many steps as their data holds against the share: fewer at an epoch's
	// tail, so they neither repeat it nor outweigh it, more where the tail was absorbed.
	freshSteps := lease.WindowSteps(lease.Steps(others, v.Config.Protocol.InnerSteps), fresh, others, share)
	for p, ms := range fresh {
		plan[p], steps[p] = ms, freshSteps[p]
		budget -= len(ms)
	}
	// Trainers the epoch had nothing left for are leased from the next one (ahead.go).
	ahead, aheadSteps := r.leaseAhead(others, fresh, len(rest), share, budget, v.Config.Protocol.InnerSteps, seed)
	for _, ms := range ahead {
		budget -= len(ms)
	}
	var next map[string][]uint32
	var nextSteps map[string]int
	// No reservation for a round after the experiment's last.
	if v.Config.Protocol.Overlap == config.OverlapEager && !v.Config.Experiment.RoundLimitReached(r.round) {
		next, nextSteps = reserve(r.nextPool(avail, plan, ahead), plan, work, share, budget, v.Config.Protocol.InnerSteps, seed)
	}
	for p, ms := range ahead {
		plan[p], steps[p] = ms, aheadSteps[p]
		v.Log.Info("the epoch had nothing left for a trainer: leased microshards of the next epoch", "round", r.round,
			"peer", p, "epoch", r.base.Ledger.Epoch+1, "microshards", len(ms))
	}
	peers := make([]string, 0, len(plan))
	for p := range plan {
		peers = append(peers, p)
	}
	sort.Strings(peers)
	var pace []lease.Pace
	for _, p := range peers {
		pace = append(pace, lease.Pace{Peer: p, SecondsPerStep: v.paces.get(p), Announced: v.trainers.stepSeconds(p), Steps: steps[p],
			Missed: r.missedBy(p, v.trainers.returns(p))})
		r.returns[p] = v.trainers.returns(p)
	}
	r.window = lease.Deadline(pace, lease.Timing{Floor: v.Config.Lease.MinDeadline, Ceiling: v.Config.Lease.RoundTimeout,
		Unknown: v.Config.Lease.FirstDeadline})
	r.deadline = time.Now().Add(r.window)
	msg := &gossip.Leases{Experiment: v.Config.Experiment.ID, Round: r.round, Base: r.baseID.Bytes(), Issuer: v.Self,
		Deadline: r.deadline.UnixMilli(), Attempt: r.attempt}
	r.leases = map[cid.Cid]lease.Lease{}
	leased := map[string]int{}
	for _, p := range peers {
		l := lease.Lease{Round: r.round, Base: r.baseID.Bytes(), Trainer: p, Microshards: plan[p],
			Expiry: r.deadline.UnixMilli(), Issuer: v.Self, Epoch: r.base.Ledger.Epoch, Steps: uint32(steps[p])}
		if _, ok := ahead[p]; ok {
			l.Epoch++
		}
		if ns := next[p]; len(ns) > 0 {
			l.Next, l.NextSteps = ns, uint32(nextSteps[p])
		}
		r.leases[l.ID()] = l
		r.all = append(r.all, l)
		msg.Leases = append(msg.Leases, l)
		leased[p] = len(l.Microshards)
	}
	r.book.Grant(msg.Leases)
	// Its own leases too: should it step aside and lead the round again, or restart (they
	// are kept in GrantsFile), a contribution under one of them is late, not unknown.
	v.grants.record(v.Self, msg)
	v.keepGrant(msg, r.base.Round)
	v.Sink.Status(func(vs *Status) {
		*vs = Status{Phase: vs.Phase, Round: r.round, Attempt: r.attempt, Leased: leased, Deadline: r.deadline, Trainers: len(cands),
			Quarantined: v.quarantine.List(r.round), Barred: r.book.Barred(), Rejections: vs.Rejections, Recent: vs.Recent}
	})
	v.Log.Info("issued leases", "round", r.round, "attempt", r.attempt, "trainers", len(peers), "deadline", time.Until(r.deadline).Round(time.Millisecond).String())
	return v.Bus.Publish(ctx, msg)
}

// workCandidates are the trainers as lease sizing sees them: with speed-proportional work
// their measured capacities, otherwise all alike (capacity unknown counts as average), so
// every trainer gets inner_steps and the same share of microshards (windowShare).
func workCandidates(cands []lease.Trainer, proportional bool) []lease.Trainer {
	if proportional {
		return cands
	}
	out := slices.Clone(cands)
	for i := range out {
		out[i].Capacity = 0
	}
	return out
}
