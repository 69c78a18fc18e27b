package validator

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/round"
)

// A leader with a workload judges a round's updates against an update of its own: a
// window it trains on the round's base, on microshards it draws from the round's seed,
// through its own worker, while the trainers train theirs (FLTrust's server update). No
// trainer sets it — not the cohort's majority, not whoever the chain merged first — so
// half a cohort attacking, or one attacker first at the door of a young chain, cannot make
// honest updates look odd (merge.Screening.SetTrusted). The proposal names the reference's
// artifact, and the other validators fetch it and recompute the verdicts with it bit for
// bit, as they recompute everything else.

// ReferenceTrainer trains a validator's reference window: an inner-step window on base
// over the given microshards, stored as a delta artifact (round.Trainer.Train with the
// fp32 codec).
type ReferenceTrainer interface {
	Train(ctx context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*round.Result, error)
}

// referenceJob is a reference window on its way; done closes when id or err is set.
type referenceJob struct {
	done   chan struct{}
	id     cid.Cid
	norm   float64
	err    error
	took   time.Duration
	pass   int // the round's pass it judges (lease.Book.Passes)
	shards []uint32
}

// ReferenceShards draws k distinct microshards of the n the plan holds for the reference
// window on base in the round's given pass (lease.Book.Passes): from base's parameters,
// round and the pass, so every validator draws the same.
func ReferenceShards(base *chain.Head, pass, n, k int) []uint32 {
	if n <= 0 || k <= 0 {
		return nil
	}
	h := sha256.New()
	h.Write([]byte("p2ptrain-reference/1"))
	h.Write(base.Params)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], base.Round)
	h.Write(b[:])
	if pass > 0 { // pass 0 draws what it drew before passes had draws of their own
		binary.LittleEndian.PutUint64(b[:], uint64(pass))
		h.Write(b[:])
	}
	sum := h.Sum(nil)
	rng := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(sum[:8]), binary.LittleEndian.Uint64(sum[8:16])))
	perm := rng.Perm(n)[:min(k, n)]
	out := make([]uint32, len(perm))
	for i, p := range perm {
		out[i] = uint32(p)
	}
	slices.Sort(out)
	return out
}

// referenceSeed is the reference window's batch-order seed: the experiment's, mixed with
// the round and the pass.
func referenceSeed(experiment int64, round uint64, pass int) int64 {
	return int64(uint64(experiment)*0x9e3779b97f4a7c15 ^ round ^ 0x7265666572656e63 ^ uint64(pass)<<40)
}

// startReference starts training the reference window for r's current pass on ctx, when
// this validator has a reference trainer and a plan to draw from (nil otherwise).
//
// Each pass trains a window of its own. The honest windows of one base, on a model near
// convergence, are mostly noise to any one reference, and their mean cosine to it is
// negative in some rounds (the digits swarm: the merged windows' mean cosine to the
// reference was negative in rounds 7, 11 and 13 of the first 14 of one run). Where every
// trainer of the round is on probation (merge.Screening.SetProbation: a positive cosine
// to the reference), a reference drawn once per round rejected every window of every
// pass, and the swarm stopped at that round for good (CI at stop 50:
// TestSwarmPoisonedTrainerIsQuarantined, round 4, 41 attempts in 10 passes). A new pass
// draws new microshards and a new seed; the proposal names the artifact of the pass's
// reference, which the followers fetch and judge with.
func (v *validator) startReference(ctx context.Context, r *openRound) *referenceJob {
	if v.Reference == nil || v.Plan == nil || len(v.Plan.Shards) == 0 {
		return nil
	}
	share := v.referenceShare()
	pass := r.book.Passes()
	j := &referenceJob{done: make(chan struct{}), pass: pass, shards: ReferenceShards(r.base, pass, len(v.Plan.Shards), share)}
	steps := v.Config.Protocol.InnerSteps
	seed := referenceSeed(v.Config.Experiment.Seed, r.round, pass)
	base := r.base
	prev := r.ref
	go func() {
		defer close(j.done)
		if prev != nil {
			// One window at a time through the worker: the last pass's may still train.
			select {
			case <-prev.done:
			case <-ctx.Done():
				j.err = ctx.Err()
				return
			}
		}
		began := time.Now()
		res, err := v.Reference.Train(ctx, base, j.shards, steps, seed)
		j.took = time.Since(began)
		switch {
		case err != nil:
			j.err = err
		case math.IsNaN(res.DeltaNorm) || math.IsInf(res.DeltaNorm, 0):
			j.err = fmt.Errorf("norm %v", res.DeltaNorm)
		default:
			j.id, j.norm = res.Delta, res.DeltaNorm
		}
	}()
	return j
}

// reference waits for r's reference window and returns its artifact; cid.Undef when
// there is none (no reference trainer, or its window failed: the round is then screened
// against the cohort and the momentum, and the log says so).
func (v *validator) reference(ctx context.Context, r *openRound) (cid.Cid, error) {
	j := r.ref
	if j == nil {
		return cid.Undef, nil
	}
	select {
	case <-j.done:
	case <-ctx.Done():
		return cid.Undef, ctx.Err()
	}
	if j.err != nil {
		if ctx.Err() != nil {
			return cid.Undef, ctx.Err()
		}
		v.Log.Warn("reference window failed: this round is screened without it", "round", r.round, "err", j.err)
		return cid.Undef, nil
	}
	v.Log.Debug("reference window", "round", r.round, "pass", j.pass, "microshards", j.shards, "norm", j.norm, "seconds", j.took.Seconds())
	return j.id, nil
}

// fetchBaseReference brings the reference update base was screened with (if any) into the
// store: a round screened against a reference is also screened against the cosine
// between it and the base's (merge.Screening.SetPrevious), so every validator merging or
// verifying the round must hold both. The proposer of the round holds it (it merged
// with it), as do the validators that attested base (they verified with it); hints name
// where to ask first, then whoever is known to hold it.
func (v *validator) fetchBaseReference(ctx context.Context, base *chain.Head, hints ...peer.ID) error {
	id, err := base.ReferenceID()
	if err != nil || !id.Defined() {
		return err
	}
	if err := v.Bus.Fetch(ctx, id, hints...); err != nil {
		return fmt.Errorf("fetch the reference update of round %d, %s: %w", base.Round, id, err)
	}
	return nil
}
