package validator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/bus"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
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
	Params
	trainers *trainerSet
	checks   *checks // the proposals of other validators being checked (checks.go)
	// work counts the goroutines the run starts off its loop (proposal checks, delta
	// fetches): cancelled with their round or the run, joined when the run ends.
	work       sync.WaitGroup
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
	// ownGrants are this validator's grants of the rounds open here, kept in GrantsFile
	// (grants.go) so that a restart forgets none.
	ownGrants []*gossip.Leases
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
	// heldOut evaluates the heads this validator proposed once they are published
	// (heldout.go); evalMu keeps one held-out evaluation at a time.
	heldOut *heldOut
	evalMu  sync.Mutex
}

type lockedHead struct {
	id  cid.Cid
	msg *gossip.Head // the proposal, re-published until the round ends
}

// Params is what the validator role uses.
type Params struct {
	Config     *config.Config
	Self       string         // this node's peer ID
	Key        crypto.PrivKey // signs heads, attestations and round notes
	Validators []string       // the peers whose signatures make a head canonical
	Bus        bus.Bus
	Tips       *chain.Tips
	Heads      *chain.Store
	Store      *artifact.Store
	// Merger merges a round's contributions, proposing or recomputing a proposal.
	Merger *round.Merger
	// Runtime makes genesis and evaluates heads; nil when the node runs no workload (it then
	// waits for genesis from another validator and evaluates nothing).
	Runtime Runtime
	// Reference, when set, trains the leader's own reference window each round, against
	// which every contribution is screened (reference.go); nil screens against the cohort
	// and the momentum. RequireReference makes a follower refuse a proposal that names no
	// reference.
	Reference        ReferenceTrainer
	RequireReference bool
	// Plan and PlanID are the dataset's microshard plan: genesis's ledger and the size of
	// the windows leased.
	Plan   *dataset.Plan
	PlanID string
	// FetchHead makes sure the artifacts a head needs to be merged from are in Store, from
	// the peers hinted first.
	FetchHead func(ctx context.Context, h *chain.Head, hints ...peer.ID) error
	// Paces are the trainers' seconds per inner step restored from a checkpoint (nil if
	// none); TrackPaces, when set, is handed the function that reads the current ones, for
	// every later checkpoint.
	Paces      map[string]float64
	TrackPaces func(snapshot func() map[string]float64)
	Sink       Sink
	Log        *slog.Logger
}

// Runtime is what the validator asks of the Python worker.
type Runtime interface {
	Init(ctx context.Context, seed int64, out string) error
	Evaluate(ctx context.Context, pack string) (map[string]float64, error)
	ScratchDir() string
}

// Sink receives what the validator does, for the node's status page and metrics.
type Sink interface {
	// Status publishes the validator's status: fn changes a copy of the last one.
	Status(fn func(s *Status))
	// Event records something a user should see on the status page.
	Event(kind, format string, args ...any)
	// Rejected counts a contribution (or proposal) rejected, by reason.
	Rejected(reason string)
	// LeaseEnded counts a lease that ended without a contribution, by how.
	LeaseEnded(how string)
	// MetricDropped counts a held-out metric dropped for not being finite.
	MetricDropped(name string)
	// RoundClosed reports a round this validator proposed: how long it took, the
	// contributions merged and its notes.
	RoundClosed(took time.Duration, merged int, notes *chain.Notes)
}

// Validator is the validator role's loop.
type Validator struct{ v *validator }

// New returns the validator role, with the signing locks of its previous run read back
// from LocksFile under Config.Node.StoreDir (it fails when that file cannot be read) and its
// grants of the rounds still open from GrantsFile; Run runs it.
func New(p Params) (*Validator, error) {
	v := newValidator(p)
	if err := v.restoreLocks(); err != nil {
		return nil, err
	}
	v.restoreGrants()
	return &Validator{v}, nil
}

// Run takes part in the rounds until ctx ends: it makes or waits for genesis, then leads or
// follows each round. A round that fails is logged and retried; Run fails only with ctx or
// when it cannot make genesis.
func (r *Validator) Run(ctx context.Context) error { return r.v.run(ctx) }

func newValidator(p Params) *validator {
	// Paces come back from the checkpoint and go into every later one.
	pc := &paces{m: map[string]float64{}}
	maps.Copy(pc.m, p.Paces)
	if p.TrackPaces != nil {
		p.TrackPaces(pc.snapshot)
	}
	if p.Log == nil {
		p.Log = slog.Default()
	}
	trainers := newTrainerSet()
	if p.Tips != nil {
		trainers.tip = func() (uint64, bool) {
			_, h := p.Tips.Current()
			if h == nil {
				return 0, false
			}
			return h.Round, true
		}
	}
	return &validator{Params: p, trainers: trainers, checks: newChecks(),
		quarantine: lease.NewQuarantine(2, 10, uint64(p.Config.Lease.QuarantineRounds)),
		paces:      pc, locks: map[uint64]lockedHead{}, grants: newGrantLog(), reports: map[string]staleReport{}, rejects: newRateLog(time.Hour, rejectLogBudget, func(n int) {
			p.Log.Warn("contribution rejections not logged (rate limit)", "count", n)
		}),
		nonFinite: newRateLog(100*365*24*time.Hour, 0, nil), started: time.Now()}
}

func (v *validator) isValidator(p string) bool { return slices.Contains(v.Validators, p) }

// otherValidators are the configured validators but this one, as peer ids (those that do
// not decode are left out).
func (v *validator) otherValidators() []peer.ID {
	var out []peer.ID
	for _, s := range v.Validators {
		if p, err := peer.Decode(s); err == nil && s != v.Self {
			out = append(out, p)
		}
	}
	return out
}

// done reports whether the experiment's round limit is reached.
func (v *validator) done() bool {
	_, h := v.Tips.Current()
	return h != nil && v.Config.Experiment.RoundLimitReached(h.Round)
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
	if id, _ := v.Tips.Current(); id.Defined() {
		return nil
	}
	if _, locked := v.locks[0]; locked {
		return nil // made before a restart: run sees it to its quorum
	}
	vs := slices.Clone(v.Validators)
	slices.Sort(vs)
	if vs[0] != v.Self {
		return nil
	}
	if v.Runtime == nil {
		return fmt.Errorf("genesis: this node makes round 0 but has no workload to initialise the model (set workload.*)")
	}
	out := filepath.Join(v.Runtime.ScratchDir(), "genesis.safetensors")
	// The pack is copied into the store; a copy left in scratch would be one more model's
	// bytes on disk for the life of the store.
	defer os.Remove(out)
	if err := v.Runtime.Init(ctx, v.Config.Experiment.Seed, out); err != nil {
		return fmt.Errorf("genesis: %w", err)
	}
	h, id, err := round.Genesis(v.Store, out, v.Config.Experiment.Network, v.Config.Experiment.ID, v.PlanID, len(v.Plan.Shards), v.Merger.Policy)
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
	lk := lockedHead{id: id, msg: &gossip.Head{Experiment: v.Config.Experiment.ID, Signed: *sh, Notes: notes, Proposal: &gossip.Proposal{}}}
	if err := v.lock(0, lk); err != nil {
		return fmt.Errorf("genesis: %w", err)
	}
	if _, err := v.Tips.Offer(sh); err != nil {
		return fmt.Errorf("genesis: %w", err)
	}
	v.Log.Info("made genesis", "head", id.String(), "layout", h.LayoutHash[:12])
	return v.Bus.Publish(ctx, lk.msg)
}

// signNotes signs the round notes of head id and keeps them beside the head.
func (v *validator) signNotes(id cid.Cid, round uint64, n *chain.Notes) error {
	if err := chain.SignNotes(v.Key, id, n); err != nil {
		return err
	}
	return v.Tips.SetNotes(id, round, n)
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
	sig, err := chain.Sign(v.Key, id)
	if err != nil {
		return nil, err
	}
	return &chain.SignedHead{Head: b, Sigs: []chain.Signature{sig}}, nil
}

// evalDue reports whether h is to be evaluated on held-out data: this node has a workload,
// and h's round is a multiple of experiment.eval_every or the experiment's last.
func (v *validator) evalDue(h *chain.Head) bool {
	every := v.Config.Experiment.EvalEvery
	return v.Runtime != nil && every > 0 && (h.Round%uint64(every) == 0 || v.final(h.Round))
}

// final reports whether round is the experiment's last.
func (v *validator) final(round uint64) bool {
	return v.Config.Experiment.Rounds > 0 && round == uint64(v.Config.Experiment.Rounds)
}

// evaluate measures held-out metrics of a head's parameters when this node has a workload
// and evaluation is due; failures are reported, not fatal.
func (v *validator) evaluate(ctx context.Context, h *chain.Head) map[string]float64 {
	if !v.evalDue(h) {
		return nil
	}
	v.evalMu.Lock()
	defer v.evalMu.Unlock()
	id, err := h.ParamsID()
	if err != nil {
		return nil
	}
	m, err := v.Runtime.Evaluate(ctx, v.Store.BlobPath(id))
	if err != nil {
		if ctx.Err() != nil {
			// Shutting down: the call was abandoned, not failed (a quiet Ctrl-C).
			return nil
		}
		v.Log.Warn("evaluate head failed", "round", h.Round, "err", err)
		v.Sink.Event("evaluate", "round %d: %v", h.Round, err)
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
			v.Sink.MetricDropped(k)
			if v.nonFinite.allow(k) {
				v.Log.Warn("held-out metric is not finite; dropped from the head's metrics", "round", round, "metric", k, "value", fmt.Sprint(x))
				v.Sink.Event("evaluate", "round %d: held-out %s is %v; dropped (further ones are counted in p2ptrain_node_metrics_dropped_total)", round, k, x)
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
	v.Sink.Rejected(reason)
	if v.rejects.allow(fmt.Sprintf("%s/%d", peer, round)) {
		v.Log.Warn("contribution rejected", "peer", peer, "round", round, "reason", reason, "artifact", artifact, "detail", detail)
	}
	quarantined := false
	// Neither a late report nor work done under another validator's lease of the round
	// (two validators led it) is the trainer's fault.
	if reason != "late" && reason != ReasonForeignLease {
		quarantined = v.quarantine.Reject(peer, round, reason == string(merge.ReasonLowCosine))
	}
	if quarantined {
		v.Log.Warn("peer quarantined: no leases for a while", "peer", peer, "rounds", v.Config.Lease.QuarantineRounds)
		v.Sink.Event("quarantine", "%s quarantined for %d rounds after repeated rejections (%s)", peer, v.Config.Lease.QuarantineRounds, reason)
	}
	if len(detail) > 200 {
		detail = detail[:200]
	}
	v.Sink.Status(func(vs *Status) {
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

// Validator phases (Phase).
const (
	PhaseWaiting        = "waiting"
	PhaseIssuing        = "issuing"
	PhaseCollecting     = "collecting"
	PhaseProposing      = "proposing"
	PhaseAwaitingQuorum = "awaiting_quorum"
	PhaseFollowing      = "following"
	PhaseStandingAside  = "standing_aside"
)

// enter records that the validator is now in phase name of round; "since" moves only when
// the phase or the round changes.
func (v *validator) enter(name string, round uint64) {
	v.Sink.Status(func(vs *Status) {
		if vs.Phase == nil || vs.Phase.Name != name || vs.Phase.Round != round {
			vs.Phase = &Phase{Name: name, Round: round, Since: time.Now()}
		}
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

// RejectReasons are the values of the reason label of
// p2ptrain_node_contributions_rejected_total that a validator produces. Each starts at 0
// so that a panel of rejections by reason shows zeros, not "No data", on a healthy swarm.
// A reason not listed still counts; it just appears on its first use.
var RejectReasons = []string{
	// Checked on arrival (leader_collect.go).
	"wrong_base", "forged_peer", "no_lease", ReasonForeignLease, "late", "lease_mismatch", "replay", "copy", "malformed", reasonUnavailable,
	// Screening before the merge (round/merge.go, merge/screen.go).
	string(merge.ReasonNonFinite), string(merge.ReasonNormBound), string(merge.ReasonNormOutlier),
	string(merge.ReasonLowCosine), "no_samples", round.ReasonWrongCodec,
	// A proposal another validator made failed verification (follower.go).
	"bad_proposal",
}

var errHeadMoved = errors.New("canonical head moved on")
