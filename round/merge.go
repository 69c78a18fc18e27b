package round

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
)

// ErrNothingMerged is returned when no contribution survived screening.
var ErrNothingMerged = errors.New("no contribution passed screening")

// Policy is how a validator merges; it is recorded in every head it makes.
type Policy struct {
	Kind       string // "diloco" or "ema"
	Outer      diloco.OuterConfig
	Decay      float64
	Aggregator merge.Aggregator
	Aggregate  merge.AggregateOptions
	Screen     merge.ScreenConfig
	Codec      diloco.Codec
}

// Record is the policy as heads record it.
func (p Policy) Record() chain.Policy {
	r := chain.Policy{Kind: p.Kind, Aggregator: string(p.Aggregator), Codec: string(p.Codec)}
	if p.Kind == "diloco" {
		r.OuterLR, r.Momentum, r.Nesterov = p.Outer.LR, p.Outer.Momentum, p.Outer.Nesterov
	} else {
		r.Decay = p.Decay
	}
	return r
}

// Candidate is a contribution offered for merging.
type Candidate struct {
	Peer        string
	Delta       cid.Cid
	Lease       cid.Cid
	Samples     uint64
	Microshards []uint32
	Loss        float64
	// Quality multiplies the sample-count weight (1 when unset).
	Quality float64
}

// Rejection says why a candidate was not merged.
type Rejection struct {
	Peer   string
	Delta  cid.Cid
	Reason string
	Detail string
}

// Outcome is a merged head and what was left out.
type Outcome struct {
	Head     *chain.Head
	ID       cid.Cid
	Rejected []Rejection
	// Norms of the accepted deltas, by peer (for status and metrics).
	Norms map[string]float64
}

// Merger makes heads. Everything it computes is deterministic, so two validators merging the
// same base and candidates get the same head CID.
type Merger struct {
	Store   *artifact.Store
	Policy  Policy
	Workers int
}

// Merge screens the candidates against base, aggregates the survivors and stores the next
// head's parameters (and outer state). Candidates are taken in peer order, whatever order
// they are passed in.
func (m *Merger) Merge(ctx context.Context, baseID cid.Cid, base *chain.Head, cands []Candidate) (*Outcome, error) {
	cands = slices.Clone(cands)
	slices.SortFunc(cands, func(a, b Candidate) int { return strings.Compare(a.Peer, b.Peer) })
	for i := 1; i < len(cands); i++ {
		if cands[i].Peer == cands[i-1].Peer {
			return nil, fmt.Errorf("merge round %d: two candidates from peer %s", base.Round+1, cands[i].Peer)
		}
	}
	paramsID, err := base.ParamsID()
	if err != nil {
		return nil, err
	}
	basePack, err := pack.Load(m.Store.BlobPath(paramsID))
	if err != nil {
		return nil, fmt.Errorf("merge round %d: base params %s: %w", base.Round+1, paramsID, err)
	}
	defer basePack.Close()
	layoutHash := basePack.Layout.Hash()
	n := len(basePack.Values)

	out := &Outcome{Norms: map[string]float64{}}
	var deltas [][]float32
	var kept []Candidate
	for _, c := range cands {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := m.decode(c.Delta, layoutHash, n)
		if err != nil {
			out.Rejected = append(out.Rejected, Rejection{Peer: c.Peer, Delta: c.Delta, Reason: "malformed", Detail: err.Error()})
			continue
		}
		deltas = append(deltas, d)
		kept = append(kept, c)
	}
	ref, err := m.reference(base, basePack)
	if err != nil {
		return nil, fmt.Errorf("merge round %d: %w", base.Round+1, err)
	}
	hist := HistoryOf(base)
	verdicts, err := merge.ScreenWith(deltas, ref, hist, m.Policy.Screen, m.Workers)
	if err != nil {
		return nil, fmt.Errorf("merge round %d: %w", base.Round+1, err)
	}
	var accepted [][]float32
	var weights []float64
	var merged []Candidate
	for i, v := range verdicts {
		c := kept[i]
		if !v.Accepted {
			out.Rejected = append(out.Rejected, Rejection{Peer: c.Peer, Delta: c.Delta, Reason: string(v.Reason),
				Detail: fmt.Sprintf("norm %.4g, cosine %.3f", v.Norm, v.Cosine)})
			continue
		}
		q := c.Quality
		if q == 0 {
			q = 1
		}
		w := float64(c.Samples) * q
		if w <= 0 {
			out.Rejected = append(out.Rejected, Rejection{Peer: c.Peer, Delta: c.Delta, Reason: "no_samples", Detail: "weight is 0"})
			continue
		}
		out.Norms[c.Peer] = v.Norm
		accepted = append(accepted, deltas[i])
		weights = append(weights, w)
		merged = append(merged, c)
	}
	if len(accepted) == 0 {
		return out, fmt.Errorf("merge round %d: %w (%d candidates)", base.Round+1, ErrNothingMerged, len(cands))
	}
	mean := make([]float32, n)
	if err := merge.Aggregate(m.Policy.Aggregator, mean, accepted, weights, m.Policy.Aggregate, m.Workers); err != nil {
		return nil, fmt.Errorf("merge round %d: %w", base.Round+1, err)
	}
	head, err := m.apply(base, baseID, basePack, mean, merged)
	if err != nil {
		return nil, fmt.Errorf("merge round %d: %w", base.Round+1, err)
	}
	head.Metrics.Screen = screenStats(hist.Next(acceptedVerdicts(verdicts, kept, merged)))
	out.Head = head
	if out.ID, err = head.ID(); err != nil {
		return nil, err
	}
	return out, nil
}

// reference is the vector small cohorts are screened against: the recent merged updates
// every validator holds for the base head — the outer momentum of a diloco head (nil for
// ema heads and before the first outer step).
func (m *Merger) reference(base *chain.Head, basePack *pack.Pack) ([]float32, error) {
	if m.Policy.Kind != "diloco" || m.Policy.Screen.MinCosine == nil {
		return nil, nil
	}
	oid, err := base.OuterStateID()
	if err != nil || !oid.Defined() {
		return nil, err
	}
	mp, err := pack.Load(m.Store.BlobPath(oid))
	if err != nil {
		return nil, fmt.Errorf("outer state %s: %w", oid, err)
	}
	defer mp.Close()
	if err := mp.CheckLayout(basePack.Layout); err != nil {
		return nil, fmt.Errorf("outer state %s: %w", oid, err)
	}
	return slices.Clone(mp.Values), nil
}

// acceptedVerdicts keeps the verdicts of the candidates that were merged (screening may
// accept a candidate that is then dropped for having no weight), so the history is a
// function of the merged contributions alone.
func acceptedVerdicts(verdicts []merge.Verdict, kept, merged []Candidate) []merge.Verdict {
	in := map[string]bool{}
	for _, c := range merged {
		in[c.Peer] = true
	}
	out := make([]merge.Verdict, 0, len(merged))
	for i, v := range verdicts {
		if v.Accepted && in[kept[i].Peer] {
			out = append(out, v)
		}
	}
	return out
}

// HistoryOf is the screening history a head carries (empty for heads made before heads
// carried it, and for genesis).
func HistoryOf(h *chain.Head) merge.History {
	s := h.Metrics.Screen
	if s == nil {
		return merge.History{}
	}
	return merge.History{Rounds: s.Rounds, Norm: s.Norm,
		Cohort: merge.Moments{N: s.CohortN, Mean: s.CohortMean, Var: s.CohortVar},
		Ref:    merge.Moments{N: s.RefN, Mean: s.RefMean, Var: s.RefVar}}
}

func screenStats(h merge.History) *chain.ScreenStats {
	return &chain.ScreenStats{Rounds: h.Rounds, Norm: h.Norm,
		CohortN: h.Cohort.N, CohortMean: h.Cohort.Mean, CohortVar: h.Cohort.Var,
		RefN: h.Ref.N, RefMean: h.Ref.Mean, RefVar: h.Ref.Var}
}

func (m *Merger) decode(id cid.Cid, layoutHash string, n int) ([]float32, error) {
	blob, err := m.Store.Open(id)
	if err != nil {
		return nil, err
	}
	defer blob.Close()
	enc, err := ParseDelta(blob.Bytes(), layoutHash, n)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	d := make([]float32, n)
	if err := diloco.Decode(enc, d, m.Workers); err != nil {
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	return d, nil
}

// apply makes the next parameters from the aggregated delta and builds the head.
func (m *Merger) apply(base *chain.Head, baseID cid.Cid, basePack *pack.Pack, mean []float32, merged []Candidate) (*chain.Head, error) {
	n := len(basePack.Values)
	params := make([]float32, n)
	var outerID cid.Cid
	switch m.Policy.Kind {
	case "diloco":
		copy(params, basePack.Values)
		momentum := make([]float32, n)
		if oid, err := base.OuterStateID(); err != nil {
			return nil, err
		} else if oid.Defined() {
			mp, err := pack.Load(m.Store.BlobPath(oid))
			if err != nil {
				return nil, fmt.Errorf("outer state %s: %w", oid, err)
			}
			if err := mp.CheckLayout(basePack.Layout); err != nil {
				mp.Close()
				return nil, fmt.Errorf("outer state %s: %w", oid, err)
			}
			copy(momentum, mp.Values)
			mp.Close()
		}
		if err := diloco.OuterStep(params, momentum, mean, m.Policy.Outer, m.Workers); err != nil {
			return nil, err
		}
		id, err := m.storePack(basePack.Layout, momentum, map[string]string{"kind": "outer_momentum"})
		if err != nil {
			return nil, err
		}
		outerID = id
	case "ema":
		// The mean of the local models is base − mean Δ; the EMA moves base toward it.
		localMean := make([]float32, n)
		if err := diloco.PseudoGradient(localMean, basePack.Values, mean, m.Workers); err != nil {
			return nil, err
		}
		if err := merge.EMA(params, basePack.Values, localMean, m.Policy.Decay, m.Workers); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown merge policy %q", m.Policy.Kind)
	}
	if name := (&pack.Pack{Layout: basePack.Layout, Values: params}).Finite(); name != "" {
		return nil, fmt.Errorf("%w: merged parameters hold NaN/Inf in %q", ErrNonFinite, name)
	}
	paramsID, err := m.storePack(basePack.Layout, params, nil)
	if err != nil {
		return nil, err
	}
	shards := make([][]uint32, len(merged))
	contribs := make([]chain.Contribution, len(merged))
	var samples uint64
	var lossSum, wSum float64
	for i, c := range merged {
		shards[i] = c.Microshards
		q := c.Quality
		if q == 0 {
			q = 1
		}
		contribs[i] = chain.Contribution{Peer: c.Peer, Artifact: c.Delta.Bytes(), Samples: c.Samples,
			Weight: float64(c.Samples) * q, Microshards: c.Microshards, Loss: c.Loss}
		if c.Lease.Defined() {
			contribs[i].Lease = c.Lease.Bytes()
		}
		samples += c.Samples
		lossSum += c.Loss * float64(c.Samples)
		wSum += float64(c.Samples)
	}
	ledger, err := lease.Apply(base.Ledger, shards...)
	if err != nil {
		return nil, err
	}
	h := &chain.Head{
		Version: 1, Network: base.Network, Experiment: base.Experiment, Round: base.Round + 1,
		Parent: baseID.Bytes(), Params: paramsID.Bytes(), LayoutHash: base.LayoutHash,
		Contributions: contribs, Policy: m.Policy.Record(), Ledger: ledger,
		Metrics: chain.Metrics{Samples: samples},
	}
	if wSum > 0 {
		h.Metrics.TrainLoss = lossSum / wSum
	}
	if outerID.Defined() {
		h.OuterState = outerID.Bytes()
	}
	return h, nil
}

func (m *Merger) storePack(layout pack.Layout, values []float32, meta map[string]string) (cid.Cid, error) {
	p, err := pack.New(layout, values, meta)
	if err != nil {
		return cid.Undef, err
	}
	w, err := m.Store.Create()
	if err != nil {
		return cid.Undef, err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	if _, err := p.WriteTo(bw); err != nil {
		w.Abort()
		return cid.Undef, fmt.Errorf("store pack: %w", err)
	}
	if err := bw.Flush(); err != nil {
		w.Abort()
		return cid.Undef, fmt.Errorf("store pack: %w", err)
	}
	return w.Commit()
}

// Genesis makes round 0 from an initial pack (as written by the worker's init): the pack is
// stored canonically and the ledger starts empty.
func Genesis(store *artifact.Store, initPack, network, experiment, planID string, shards int, policy Policy) (*chain.Head, cid.Cid, error) {
	p, err := pack.Load(initPack)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("genesis: %w", err)
	}
	defer p.Close()
	if name := p.Finite(); name != "" {
		return nil, cid.Undef, fmt.Errorf("genesis: %w: initial parameters hold NaN/Inf in %q", ErrNonFinite, name)
	}
	m := &Merger{Store: store}
	paramsID, err := m.storePack(p.Layout, p.Values, nil)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("genesis: %w", err)
	}
	h := &chain.Head{
		Version: 1, Network: network, Experiment: experiment, Round: 0,
		Params: paramsID.Bytes(), LayoutHash: p.Layout.Hash(), Contributions: []chain.Contribution{},
		Policy: policy.Record(), Ledger: GenesisLedger(planID, shards),
	}
	id, err := h.ID()
	if err != nil {
		return nil, cid.Undef, err
	}
	return h, id, nil
}

// GenesisLedger is the ledger of round 0: the plan, nothing consumed.
func GenesisLedger(planID string, shards int) chain.Ledger { return lease.NewLedger(planID, shards) }
