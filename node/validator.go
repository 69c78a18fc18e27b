package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/round"
)

// validator is the validator role. Every round has a leader, chosen among the validators
// in an order every node computes from the base head (lease.Leaders): the leader grants
// leases, collects and screens contributions, merges and proposes the next head; the other
// validators recompute the proposal bit for bit and attest it, and a head is canonical
// with a quorum of signatures. A validator that sees the validators ahead of it stay
// silent, or sees the one leading the round bring no head to quorum within two round
// timeouts, takes the round over (follower.go). A leader that hears a validator after it in
// the order lead its round (a takeover from a leader that was alive but heard late) steps
// aside for that round and follows the new leader's proposal (stepaside.go).
type validator struct {
	*env
	merger     *round.Merger
	trainers   *trainerSet
	quarantine *lease.Quarantine
	paces      *paces
	// locks records, per round, the head this validator signed (proposed or attested): it
	// never signs two heads for one round, so two heads of a round cannot both reach a
	// majority quorum. Each lock is written to LocksFile (lock) before its signature leaves
	// the process, and read back at start-up (restoreLocks): a restart forgets none.
	locks map[uint64]lockedHead
	// grants remembers the leases granted for the open round and the one closed last: a
	// contribution made under another validator's is not a trainer's fault (stepaside.go).
	grants *grantLog
	// reports are the last contribution, by trainer, read on a lease another validator
	// granted it (staleForeign).
	reports map[string]staleReport
	// mergeTook is how long this validator's last merge took, its own (proposing) or a
	// recomputation (verifying a proposal): the next round's leader must verify the base
	// before it can lead, and a follower gives it that long (follow).
	mergeTook time.Duration
	// rejects rate-limits rejection logs to one per peer and round.
	rejects *rateLog
	// nonFinite warns once per metric name about NaN or ±Inf held-out metrics.
	nonFinite *rateLog
	// started is when this validator started: it leases nothing before it has had one
	// announce interval to hear from the fleet, so a (re)started leader does not hand the
	// whole round to the first trainers it happens to hear.
	started time.Time
	// window is what the lease sizing last logged (windowShare).
	window windowNote
}

type lockedHead struct {
	id  cid.Cid
	msg *gossip.Head // the proposal, re-published until the round ends
}

func newValidator(e *env, merger *round.Merger) *validator {
	// Paces come back from the checkpoint and go into every later one.
	pc := &paces{m: map[string]float64{}}
	if e.keeper != nil {
		maps.Copy(pc.m, e.keeper.restoredPaces())
		e.keeper.trackPaces(pc.snapshot)
	}
	return &validator{env: e, merger: merger, trainers: newTrainerSet(),
		quarantine: lease.NewQuarantine(2, 10, uint64(e.cfg.Lease.QuarantineRounds)),
		paces:      pc, locks: map[uint64]lockedHead{}, grants: newGrantLog(), reports: map[string]staleReport{}, rejects: newRateLog(time.Hour, rejectLogBudget, func(n int) {
			e.log.Warn("contribution rejections not logged (rate limit)", "count", n)
		}),
		nonFinite: newRateLog(100*365*24*time.Hour, 0, nil), started: time.Now()}
}

func (v *validator) run(ctx context.Context) error {
	in := v.bus.Subscribe()
	defer in.Close()
	if err := v.ensureGenesis(ctx); err != nil {
		return err
	}
	for {
		if v.done() { // the watcher ends the run once it has recorded the last head
			<-ctx.Done()
			return ctx.Err()
		}
		id, head := v.tips.Current()
		var err error
		if head == nil {
			if l, locked := v.locks[0]; locked {
				err = v.awaitQuorum(ctx, in, 0, l) // our genesis, waiting for attestations
			} else {
				err = v.waitForHead(ctx, in)
			}
		} else {
			err = v.round(ctx, in, id, head)
		}
		switch {
		case err == nil, errors.Is(err, errHeadMoved):
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			v.log.Error("round failed", "round", roundOf(head), "err", err)
			v.status.event("round", "round %d failed: %v", roundOf(head), err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
}

func roundOf(h *chain.Head) uint64 {
	if h == nil {
		return 0
	}
	return h.Round + 1
}

// waitForHead processes messages until there is a canonical head (genesis from another
// validator).
func (v *validator) waitForHead(ctx context.Context, in *bus.Inbox) error {
	v.enter(phaseWaiting, 0)
	changed := v.tips.Changed()
	if id, _ := v.tips.Current(); id.Defined() {
		return nil // genesis arrived before changed was taken
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
			return nil
		case a := <-in.Announces:
			v.trainers.seen(a.From, a.Msg)
		case <-in.Contributions:
		case l := <-in.Leases:
			v.recordGrant(l)
		case h := <-in.Heads:
			v.verifyAndAttest(ctx, h.From, h.Msg)
		}
	}
}

// round runs this validator's part in the round after base: it leads when it is first in
// the order, and follows (verifying, attesting, ready to take over) otherwise.
func (v *validator) round(ctx context.Context, in *bus.Inbox, baseID cid.Cid, base *chain.Head) error {
	v.pruneLocks(base.Round)
	v.forgetClosed(base.Round)
	order := lease.Leaders(v.validators, baseID)
	rank := slices.Index(order, v.self)
	if rank == 0 {
		return v.lead(ctx, in, baseID, base, 0)
	}
	return v.follow(ctx, in, baseID, base, rank, order)
}

func (v *validator) pruneLocks(below uint64) {
	for r := range v.locks {
		if r <= below {
			delete(v.locks, r)
		}
	}
}

// ensureGenesis makes round 0 when no head exists yet and this node is the validator that
// makes it (the first in peer order); the others wait for it on the bus.
func (v *validator) ensureGenesis(ctx context.Context) error {
	if id, _ := v.tips.Current(); id.Defined() {
		return nil
	}
	if _, locked := v.locks[0]; locked {
		return nil // made before a restart: run sees it to its quorum
	}
	vs := slices.Clone(v.validators)
	slices.Sort(vs)
	if vs[0] != v.self {
		return nil
	}
	if v.rt == nil {
		return fmt.Errorf("genesis: this node makes round 0 but has no workload to initialise the model (set workload.*)")
	}
	out := filepath.Join(v.rt.ScratchDir(), "genesis.safetensors")
	// The pack is copied into the store; a copy left in scratch would be one more model's
	// bytes on disk for the life of the store.
	defer os.Remove(out)
	if err := v.rt.Init(ctx, v.cfg.Experiment.Seed, out); err != nil {
		return fmt.Errorf("genesis: %w", err)
	}
	h, id, err := round.Genesis(v.store, out, v.cfg.Experiment.Network, v.cfg.Experiment.ID, v.data.planID, len(v.data.plan.Shards), v.merger.Policy)
	if err != nil {
		return err
	}
	// Genesis needs no recomputation (it is the starting point the experiment's owner
	// chose); with several validators it is canonical once the others have signed it too.
	sh, err := v.sign(h)
	if err != nil {
		return err
	}
	notes := &chain.Notes{Round: 0, HeldOut: v.evaluate(ctx, h)}
	if err := v.signNotes(id, 0, notes); err != nil {
		return fmt.Errorf("genesis: %w", err)
	}
	lk := lockedHead{id: id, msg: &gossip.Head{Experiment: v.cfg.Experiment.ID, Signed: *sh, Notes: notes, Proposal: &gossip.Proposal{}}}
	if err := v.lock(0, lk); err != nil {
		return fmt.Errorf("genesis: %w", err)
	}
	if _, err := v.tips.Offer(sh); err != nil {
		return fmt.Errorf("genesis: %w", err)
	}
	v.log.Info("made genesis", "head", id.String(), "layout", h.LayoutHash[:12])
	return v.bus.Publish(ctx, lk.msg)
}

// signNotes signs the round notes of head id and keeps them beside the head.
func (v *validator) signNotes(id cid.Cid, round uint64, n *chain.Notes) error {
	if err := chain.SignNotes(v.key, id, n); err != nil {
		return err
	}
	return v.tips.SetNotes(id, round, n)
}

func (v *validator) sign(h *chain.Head) (*chain.SignedHead, error) {
	b, err := h.Encode()
	if err != nil {
		return nil, err
	}
	id, err := h.ID()
	if err != nil {
		return nil, err
	}
	sig, err := chain.Sign(v.key, id)
	if err != nil {
		return nil, err
	}
	return &chain.SignedHead{Head: b, Sigs: []chain.Signature{sig}}, nil
}

// evaluate measures held-out metrics of a head's parameters when this node has a workload
// and evaluation is due; failures are reported, not fatal.
func (v *validator) evaluate(ctx context.Context, h *chain.Head) map[string]float64 {
	every := v.cfg.Experiment.EvalEvery
	if v.rt == nil || every <= 0 || (h.Round%uint64(every) != 0 && !(v.cfg.Experiment.Rounds > 0 && h.Round == uint64(v.cfg.Experiment.Rounds))) {
		return nil
	}
	id, err := h.ParamsID()
	if err != nil {
		return nil
	}
	m, err := v.rt.Evaluate(ctx, v.store.BlobPath(id))
	if err != nil {
		if ctx.Err() != nil {
			// Shutting down: the call was abandoned, not failed (a quiet Ctrl-C).
			return nil
		}
		v.log.Warn("evaluate head failed", "round", h.Round, "err", err)
		v.status.event("evaluate", "round %d: %v", h.Round, err)
		return nil
	}
	return v.finiteMetrics(h.Round, m)
}

// finiteMetrics drops the NaN and ±Inf values from held-out metrics (a model gone wrong
// evaluates to NaN): metrics are data, not a reason to fail a round, and they travel in
// CBOR and JSON, neither of which the node lets carry non-finite numbers. Each dropped
// metric is counted, and warned about once per metric name.
func (v *validator) finiteMetrics(round uint64, m map[string]float64) map[string]float64 {
	var out map[string]float64
	for k, x := range m {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			v.metrics.metricDropped(k)
			if v.nonFinite.allow(k) {
				v.log.Warn("held-out metric is not finite; dropped from the head's metrics", "round", round, "metric", k, "value", fmt.Sprint(x))
				v.status.event("evaluate", "round %d: held-out %s is %v; dropped (further ones are counted in p2ptrain_node_metrics_dropped_total)", round, k, x)
			}
			continue
		}
		if out == nil {
			out = make(map[string]float64, len(m))
		}
		out[k] = x
	}
	return out
}

// rejected counts a rejected contribution by reason (metrics and /status), logs it once
// per peer and round (and at most rejectLogBudget lines a minute in all: peer ids are free
// to mint), and quarantines repeat offenders.
func (v *validator) rejected(peer string, round uint64, reason, detail, artifact string) {
	v.metrics.rejected(reason)
	if v.rejects.allow(fmt.Sprintf("%s/%d", peer, round)) {
		v.log.Warn("contribution rejected", "peer", peer, "round", round, "reason", reason, "artifact", artifact, "detail", detail)
	}
	quarantined := false
	// Neither a late report nor work done under another validator's lease of the round
	// (two validators led it) is the trainer's fault.
	if reason != "late" && reason != reasonForeignLease {
		quarantined = v.quarantine.Reject(peer, round, reason == string(merge.ReasonLowCosine))
	}
	if quarantined {
		v.log.Warn("peer quarantined: no leases for a while", "peer", peer, "rounds", v.cfg.Lease.QuarantineRounds)
		v.status.event("quarantine", "%s quarantined for %d rounds after repeated rejections (%s)", peer, v.cfg.Lease.QuarantineRounds, reason)
	}
	if len(detail) > 200 {
		detail = detail[:200]
	}
	v.updateValidatorStatus(func(vs *ValidatorStatus) {
		counts := make(map[string]uint64, len(vs.Rejections)+1)
		for k, n := range vs.Rejections {
			counts[k] = n
		}
		counts[reason]++
		vs.Rejections = counts
		recent := append(slices.Clone(vs.Recent), Rejection{At: time.Now(), Peer: peer, Round: round, Reason: reason, Artifact: artifact, Detail: detail})
		if len(recent) > maxRecentRejections {
			recent = recent[len(recent)-maxRecentRejections:]
		}
		vs.Recent = recent
		vs.Quarantined = v.quarantine.List(round)
	})
}

// Validator phases (ValidatorPhase).
const (
	phaseWaiting        = "waiting"
	phaseIssuing        = "issuing"
	phaseCollecting     = "collecting"
	phaseProposing      = "proposing"
	phaseAwaitingQuorum = "awaiting_quorum"
	phaseFollowing      = "following"
	phaseStandingAside  = "standing_aside"
)

// enter records that the validator is now in phase name of round; "since" moves only when
// the phase or the round changes.
func (v *validator) enter(name string, round uint64) {
	v.updateValidatorStatus(func(vs *ValidatorStatus) {
		if vs.Phase == nil || vs.Phase.Name != name || vs.Phase.Round != round {
			vs.Phase = &ValidatorPhase{Name: name, Round: round, Since: time.Now()}
		}
	})
}

// updateValidatorStatus changes a copy of the validator's status and publishes the copy,
// so a snapshot being read is never changed under its reader.
func (v *validator) updateValidatorStatus(fn func(vs *ValidatorStatus)) {
	v.status.update(func(s *Status) {
		var vs ValidatorStatus
		if s.Validator != nil {
			vs = *s.Validator
		}
		fn(&vs)
		s.Validator = &vs
	})
}

// paces keeps each trainer's observed seconds per inner step (an EMA over its windows).
type paces struct {
	mu sync.Mutex
	m  map[string]float64
}

func (p *paces) observe(peer string, seconds float64, steps int) {
	if seconds <= 0 || steps <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	x := seconds / float64(steps)
	if old, ok := p.m[peer]; ok {
		x = 0.7*old + 0.3*x
	}
	p.m[peer] = x
}

// snapshot copies the paces for a checkpoint.
func (p *paces) snapshot() map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.m)
}

func (p *paces) get(peer string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[peer]
}

// rateLog allows one log line per key per period, and at most budget lines a minute over
// all keys; what it holds back is summed up in one line a minute. Its memory is bounded.
type rateLog struct {
	mu         sync.Mutex
	period     time.Duration
	budget     int
	last       map[string]time.Time
	minute     time.Time
	lines      int
	suppressed int
	log        func(suppressed int) // called with what was held back over the last minute
}

// rejectLogBudget bounds the rejection lines a validator logs a minute.
const rejectLogBudget = 30

func newRateLog(period time.Duration, budget int, summary func(suppressed int)) *rateLog {
	return &rateLog{period: period, budget: budget, last: map[string]time.Time{}, log: summary}
}

func (r *rateLog) allow(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if now.Sub(r.minute) >= time.Minute {
		if r.suppressed > 0 && r.log != nil {
			r.log(r.suppressed)
		}
		r.minute, r.lines, r.suppressed = now, 0, 0
	}
	if t, ok := r.last[key]; ok && now.Sub(t) < r.period {
		return false
	}
	if r.budget > 0 && r.lines >= r.budget {
		r.suppressed++
		return false
	}
	if len(r.last) > 4096 {
		clear(r.last)
	}
	r.last[key] = now
	r.lines++
	return true
}

var errHeadMoved = errors.New("canonical head moved on")
