package round

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/internal/parallel"
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
	NewWeight  float64 // ema: the weight of the trainers' mean
	Aggregator merge.Aggregator
	Aggregate  merge.AggregateOptions
	Screen     merge.ScreenConfig
	// Codec, Int8Block and Sparse are the encoding the experiment sets (protocol.codec and
	// its settings). A contribution in another codec, with another block length, or with
	// more values per block than the round's top-k is rejected ReasonWrongCodec: a
	// decoder reads any codec, and a dense update in a sparse swarm would cost every
	// validator that fetches it many times a sparse one's bytes. Empty Codec, or zero
	// Int8Block, leaves that unchecked.
	Codec     diloco.Codec
	Int8Block int
	Sparse    diloco.SparseShape
}

// ReasonWrongCodec rejects a contribution whose encoding is not the experiment's (Policy).
const ReasonWrongCodec = "wrong_codec"

// deltaHeaderSlack bounds a delta file's header (its JSON: format, codec, length, layout
// hash, block and top-k, and the tensors' entries; 224-376 bytes as StoreDelta writes
// them), for MaxDeltaBytes.
const deltaHeaderSlack = 4 << 10

// MaxDeltaBytes is the most bytes a contribution to round of a model of n values may take
// in the policy's encoding (the largest block count and top-k it allows, and a header);
// 0 when the policy names no codec. A validator fetches no larger update
// (bus.Bus.FetchAtMost): checkWire would reject it once here.
func (p Policy) MaxDeltaBytes(n int, round uint64) uint64 {
	var payload int
	switch p.Codec {
	case diloco.FP32:
		payload = 4 * n
	case diloco.FP16:
		payload = 2 * n
	case diloco.Int8:
		block := p.Int8Block
		if block <= 0 {
			block = 1 // unchecked: the most scales any block length gives
		}
		payload = n + 4*((n+block-1)/block)
	case diloco.Sparse:
		payload = diloco.SparseWireBytes(n, p.Sparse.BlockLen(), p.Sparse.TopKFor(round))
	default:
		return 0
	}
	return uint64(payload) + deltaHeaderSlack
}

// MaxDeltaBytes is Policy.MaxDeltaBytes for a contribution on base, the model's size read
// from base's parameters: 0 (no bound) when they cannot be read here (or m is nil).
func (m *Merger) MaxDeltaBytes(base *chain.Head) uint64 {
	if m == nil || m.Store == nil {
		return 0
	}
	id, err := base.ParamsID()
	if err != nil || !m.Store.Has(id) {
		return 0
	}
	n := pack.ParamCount(m.Store.BlobPath(id))
	if n == 0 {
		return 0
	}
	return m.Policy.MaxDeltaBytes(int(n), base.Round+1)
}

// checkWire says how the encoding of a contribution to round breaks the policy's, if it
// does. e is the encoding's description (codec, block length, top-k; no data needed).
func (p Policy) checkWire(e diloco.Encoded, round uint64) error {
	if p.Codec == "" {
		return nil
	}
	if e.Codec != p.Codec {
		return fmt.Errorf("the delta is %s, the experiment's protocol.codec is %s", e.Codec, p.Codec)
	}
	switch e.Codec {
	case diloco.Int8:
		if p.Int8Block > 0 && e.BlockSize != p.Int8Block {
			return fmt.Errorf("int8 blocks of %d values, protocol.int8_block is %d", e.BlockSize, p.Int8Block)
		}
	case diloco.Sparse:
		if want := p.Sparse.BlockLen(); e.BlockSize != want {
			return fmt.Errorf("sparse blocks of %d values, protocol.sparse_block is %d", e.BlockSize, want)
		}
		if most := p.Sparse.TopKFor(round); e.TopK > most {
			return fmt.Errorf("%d values kept per block, round %d keeps at most %d (protocol.sparse_topk and its warm-up)", e.TopK, round, most)
		}
	}
	return nil
}

// Record is the policy as heads record it.
func (p Policy) Record() chain.Policy {
	r := chain.Policy{Kind: p.Kind, Aggregator: string(p.Aggregator), Codec: string(p.Codec)}
	if p.Kind == "diloco" {
		r.OuterLR, r.Momentum, r.Nesterov = p.Outer.LR, p.Outer.Momentum, p.Outer.Nesterov
	} else {
		r.NewWeight = p.NewWeight
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
	// Probation holds the delta to the screening floor once the history is warm (see
	// merge.Screening.SetProbation): the peer has not been merged often enough in recent
	// heads to be trusted. Every validator derives it from the chain the same way.
	Probation bool
	// Sole says the peer is the only one merged in recent heads: the swarm has had one
	// trainer, and a round of its update alone is not judged by direction (see
	// merge.Screening.SetSole). Every validator derives it from the chain the same way.
	Sole bool
	// Ahead: its lease was of the epoch after the base head's ledger
	// (lease.Lease.Ahead), so its microshards are consumed in that epoch.
	Ahead bool
}

// TrustMerges is how many recent heads must have merged a peer's contributions for its
// next one to be screened without probation: as many as the rounds screening needs to warm
// up, so that honest peers merged from the first round are trusted by the time the
// calibrated bars take over. New peers, peers back from quarantine (whose rejected updates
// were never merged) and peers away for the whole window are held to the screening floor
// until then (merge.Screening.SetProbation).
const TrustMerges = merge.HistoryWarmup

// OnProbation is Candidate.Probation for peer, from the recent heads' merges per peer
// (chain.Store.RecentMerges).
func OnProbation(merges map[string]int, peer string) bool { return merges[peer] < TrustMerges }

// Sole is Candidate.Sole for peer, from the recent heads' merges per peer: peer is the only
// one they name (one node's run).
func Sole(merges map[string]int, peer string) bool { return len(merges) == 1 && merges[peer] > 0 }

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
	// Screened sums up the accepted deltas' screening figures for the log: the lowest
	// cosine to the cohort and to the momentum, and the bars they were held to.
	Screened string
}

// Merger makes heads. Everything it computes is deterministic, so two validators merging the
// same base and candidates get the same head CID.
type Merger struct {
	Store   *artifact.Store
	Policy  Policy
	Workers int
	// Block is the number of values read from each input at a time: 0 means StreamBlock,
	// otherwise a positive multiple of parallel.ChunkLen.
	Block int
	// Observe, when set, is told how long each stage of a merge took: "open" (the base and
	// the contributions opened and checked), "screen" (norms, cosines, verdicts) and "step"
	// (aggregate, outer step, the next params and momentum written, the head built).
	// Benchmarks and logs use it; it does not change the result.
	Observe func(stage string, d time.Duration)
}

func (m *Merger) observe(stage string, since time.Time) time.Time {
	now := time.Now()
	if m.Observe != nil {
		m.Observe(stage, now.Sub(since))
	}
	return now
}

func (m *Merger) block() (int, error) {
	switch {
	case m.Block == 0:
		return StreamBlock, nil
	case m.Block < 0 || m.Block%parallel.ChunkLen != 0:
		return 0, fmt.Errorf("merge block %d is not a positive multiple of %d", m.Block, parallel.ChunkLen)
	}
	return m.Block, nil
}

// Merge screens the candidates against base, aggregates the survivors and stores the next
// head's parameters (and outer state). Candidates are taken in peer order, whatever order
// they are passed in.
//
// Nothing is held whole: the contributions, the base parameters and the outer momentum
// are read from the store StreamBlock values at a time (positioned reads, no mapping), in
// up to three passes — norms, cosines (if screening needs them), then aggregate, outer
// step and write — and the new parameters and momentum are written to the store as they
// are made. Memory is a few blocks per contribution, whatever the model size; the bits
// are those of screening, aggregating and stepping whole vectors.
func (m *Merger) Merge(ctx context.Context, baseID cid.Cid, base *chain.Head, cands []Candidate) (*Outcome, error) {
	return m.MergeWith(ctx, baseID, base, cands, cid.Undef)
}

// MergeWith is Merge with ref, when defined, the artifact of a reference update a validator
// trained itself on base (an fp32 delta of base's layout, stored like a contribution's):
// screening then judges every candidate against it alone (merge.Screening.SetTrusted),
// not against the cohort or the momentum. Every validator merging the same base,
// candidates and reference gets the same head.
func (m *Merger) MergeWith(ctx context.Context, baseID cid.Cid, base *chain.Head, cands []Candidate, ref cid.Cid) (*Outcome, error) {
	cands = slices.Clone(cands)
	slices.SortFunc(cands, func(a, b Candidate) int { return strings.Compare(a.Peer, b.Peer) })
	for i := 1; i < len(cands); i++ {
		if cands[i].Peer == cands[i-1].Peer {
			return nil, fmt.Errorf("merge round %d: two candidates from peer %s", base.Round+1, cands[i].Peer)
		}
	}
	out, err := m.merge(ctx, baseID, base, cands, ref)
	if err != nil {
		return out, fmt.Errorf("merge round %d: %w", base.Round+1, err)
	}
	return out, nil
}

func (m *Merger) merge(ctx context.Context, baseID cid.Cid, base *chain.Head, cands []Candidate, refID cid.Cid) (*Outcome, error) {
	B, err := m.block()
	if err != nil {
		return nil, err
	}
	stageStart := time.Now()
	paramsID, err := base.ParamsID()
	if err != nil {
		return nil, err
	}
	baseR, momR, err := m.openBase(base, paramsID)
	if err != nil {
		return nil, err
	}
	defer baseR.Close()
	if momR != nil {
		defer momR.Close()
	}
	layout := baseR.Layout
	layoutHash := layout.Hash()
	n := int(layout.Params())

	out := &Outcome{Norms: map[string]float64{}}
	var srcs []*deltaSource
	defer func() {
		for _, s := range srcs {
			s.Close()
		}
	}()
	var kept []Candidate
	var raw []byte // read buffer shared by the sources, which are read one at a time
	for _, c := range cands {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s, err := openDelta(m.Store, c.Delta, layoutHash, n, m.Workers, &raw)
		if err != nil {
			out.Rejected = append(out.Rejected, Rejection{Peer: c.Peer, Delta: c.Delta, Reason: "malformed", Detail: err.Error()})
			continue
		}
		if err := m.Policy.checkWire(s.encoding(), base.Round+1); err != nil {
			s.Close()
			out.Rejected = append(out.Rejected, Rejection{Peer: c.Peer, Delta: c.Delta, Reason: ReasonWrongCodec, Detail: err.Error()})
			continue
		}
		srcs = append(srcs, s)
		kept = append(kept, c)
	}

	// The reference for small cohorts is the outer momentum: the recent merged updates every
	// validator holds for the base head (none for ema heads and before the first step). A
	// trusted reference, the validator's own update, replaces it and judges every cohort.
	var refR, prevR valueReader
	trusted := refID.Defined()
	if trusted {
		rs, err := openDelta(m.Store, refID, layoutHash, n, m.Workers, nil)
		if err != nil {
			return nil, fmt.Errorf("reference update %s: %w", refID, err)
		}
		defer rs.Close()
		refR = refValues{rs}
		// The base's reference, when it was screened against one: the cosine between
		// the two sets the least bar (merge.Screening.SetPrevious). Every validator
		// verifying the round holds it (validator.verifyProposal fetches it); one that
		// cannot read it cannot merge the round as the others do.
		prevID, err := base.ReferenceID()
		if err != nil {
			return nil, err
		}
		if prevID.Defined() {
			ps, err := openDelta(m.Store, prevID, layoutHash, n, m.Workers, nil)
			if err != nil {
				return nil, fmt.Errorf("the base's reference update %s: %w", prevID, err)
			}
			defer ps.Close()
			prevR = refValues{ps}
		}
	} else if momR != nil {
		refR = momR
	}
	stageStart = m.observe("open", stageStart)
	hasRef := trusted || momR != nil && m.Policy.Screen.MinCosine != nil
	hist := HistoryOf(base)
	screen, err := merge.NewScreening(m.Policy.Screen, hist, len(srcs), n, hasRef, m.Workers)
	if err != nil {
		return nil, err
	}
	if trusted {
		if err := screen.SetTrusted(); err != nil {
			return nil, err
		}
		if prevR != nil {
			if err := screen.SetPrevious(); err != nil {
				return nil, err
			}
		}
	}
	probation, sole := make([]bool, len(kept)), make([]bool, len(kept))
	for k, c := range kept {
		probation[k], sole[k] = c.Probation, c.Sole
	}
	if err := screen.SetProbation(probation); err != nil {
		return nil, err
	}
	if err := screen.SetSole(sole); err != nil {
		return nil, err
	}
	in := newInputs(srcs, n, B)
	all := make([]int, len(srcs))
	for k := range all {
		all[k] = k
	}
	for lo := 0; lo < n || lo == 0; lo += B {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hi := min(lo+B, n)
		blocks, err := in.read(lo, hi, all)
		if err != nil {
			return nil, err
		}
		if err := screen.AddNorms(lo, blocks); err != nil {
			return nil, err
		}
		if hi == n {
			break
		}
	}
	if screen.NeedsCosines() {
		active := screen.Active()
		var ref, prev blockReader
		if hasRef {
			ref = newBlockReader(refR, B, n)
		}
		if prevR != nil {
			prev = newBlockReader(prevR, B, n)
		}
		for lo := 0; lo < n; lo += B {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			hi := min(lo+B, n)
			blocks, err := in.read(lo, hi, active)
			if err != nil {
				return nil, err
			}
			r, err := ref.read(lo, hi)
			if err != nil {
				return nil, err
			}
			p, err := prev.read(lo, hi)
			if err != nil {
				return nil, err
			}
			if err := screen.AddCosinesWithPrevious(lo, blocks, r, p); err != nil {
				return nil, err
			}
		}
	}
	verdicts, err := screen.Verdicts()
	if err != nil {
		return nil, err
	}
	stageStart = m.observe("screen", stageStart)

	var accepted []int
	var weights, norms []float64
	var merged []Candidate
	var mergedVerdicts []merge.Verdict
	for k, v := range verdicts {
		c := kept[k]
		if !v.Accepted {
			d := rejectionDetail(v)
			if l := screen.SelfLimit(); !math.IsNaN(l) {
				d += fmt.Sprintf(" (the references' limit %.3f)", l)
			}
			if c.Probation {
				d += ", on probation"
			}
			out.Rejected = append(out.Rejected, Rejection{Peer: c.Peer, Delta: c.Delta, Reason: string(v.Reason), Detail: d})
			continue
		}
		w := float64(c.Samples) * quality(c)
		if w <= 0 {
			out.Rejected = append(out.Rejected, Rejection{Peer: c.Peer, Delta: c.Delta, Reason: "no_samples", Detail: "weight is 0"})
			continue
		}
		out.Norms[c.Peer] = v.Norm
		accepted = append(accepted, k)
		weights = append(weights, w)
		norms = append(norms, v.Norm)
		merged = append(merged, c)
		mergedVerdicts = append(mergedVerdicts, v)
	}
	if len(accepted) == 0 {
		return out, fmt.Errorf("%w (%d candidates)", ErrNothingMerged, len(cands))
	}
	out.Screened = screenedSummary(mergedVerdicts)
	if c := screen.SelfCosine(); !math.IsNaN(c) {
		out.Screened += fmt.Sprintf(", reference to the base's %.3f", c)
		if l := screen.SelfLimit(); !math.IsNaN(l) {
			out.Screened += fmt.Sprintf(", the references' limit %.3f", l)
		}
	}

	paramsOut, outerOut, err := m.step(ctx, B, layout, baseR, momR, n, accepted, weights, norms, in)
	if err != nil {
		return nil, err
	}
	head, err := buildHead(m.Policy, base, baseID, paramsOut, outerOut, merged)
	if err != nil {
		return nil, err
	}
	head.Metrics.Screen = screenStats(hist.Next(mergedVerdicts).WithSelf(screen.SelfCosine()))
	if trusted {
		head.Reference = refID.Bytes()
	}
	out.Head = head
	if out.ID, err = head.ID(); err != nil {
		return nil, err
	}
	m.observe("step", stageStart)
	return out, nil
}

// valueReader reads values [lo, lo+len(dst)) of a stored vector (a delta, a pack).
type valueReader interface {
	ReadValues(lo int64, dst []float32) error
}

// blockReader reads one vector block by block into a buffer of its own; its zero value
// reads nothing (nil blocks).
type blockReader struct {
	src valueReader
	buf []float32
}

func newBlockReader(src valueReader, B, n int) blockReader {
	return blockReader{src: src, buf: make([]float32, min(B, n))}
}

func (b blockReader) read(lo, hi int) ([]float32, error) {
	if b.src == nil {
		return nil, nil
	}
	v := b.buf[:hi-lo]
	return v, b.src.ReadValues(int64(lo), v)
}

func rejectionDetail(v merge.Verdict) string {
	d := fmt.Sprintf("norm %.4g, cosine %.3f", v.Norm, v.Cosine)
	switch {
	case v.Trusted:
		d += fmt.Sprintf(", cosine to reference %.3f, reference norm %.4g", v.RefCosine, v.RefNorm)
	case v.RefCosine != 0:
		d += fmt.Sprintf(", cosine to momentum %.3f", v.RefCosine)
	}
	if !math.IsNaN(v.Bar) {
		d += fmt.Sprintf(", bar %.3f", v.Bar)
	}
	return d
}

// screenedSummary is the accepted deltas' lowest and mean cosines and the bar, for the log (the
// cosines of accepted updates say how close honest updates come to the bar).
func screenedSummary(vs []merge.Verdict) string {
	minC, minR, bar := math.Inf(1), math.Inf(1), math.NaN()
	var sumC, sumR float64
	var nC, nR int
	refName := "momentum"
	for _, v := range vs {
		if v.Trusted {
			refName = "reference"
		}
		if v.Cosine != 0 {
			minC, sumC, nC = min(minC, v.Cosine), sumC+v.Cosine, nC+1
		}
		if v.RefCosine != 0 {
			minR, sumR, nR = min(minR, v.RefCosine), sumR+v.RefCosine, nR+1
		}
		if !math.IsNaN(v.Bar) {
			bar = v.Bar
		}
	}
	var parts []string
	if !math.IsInf(minC, 1) {
		parts = append(parts, fmt.Sprintf("cosine min %.3f mean %.3f", minC, sumC/float64(nC)))
	}
	if !math.IsInf(minR, 1) {
		parts = append(parts, fmt.Sprintf("to %s min %.3f mean %.3f", refName, minR, sumR/float64(nR)))
	}
	if !math.IsNaN(bar) {
		parts = append(parts, fmt.Sprintf("bar %.3f", bar))
	}
	return strings.Join(parts, ", ")
}

func quality(c Candidate) float64 {
	if c.Quality == 0 {
		return 1
	}
	return c.Quality
}

// openBase opens the base head's parameters and, for diloco, its outer momentum (nil
// before the first outer step) for range reads.
func (m *Merger) openBase(base *chain.Head, paramsID cid.Cid) (baseR, momR *pack.PackReader, err error) {
	baseR, err = pack.OpenPackReader(m.Store.BlobPath(paramsID))
	if err != nil {
		return nil, nil, fmt.Errorf("base params %s: %w", paramsID, err)
	}
	if m.Policy.Kind != "diloco" {
		return baseR, nil, nil
	}
	oid, err := base.OuterStateID()
	if err == nil && oid.Defined() {
		momR, err = pack.OpenPackReader(m.Store.BlobPath(oid))
		if err != nil {
			err = fmt.Errorf("outer state %s: %w", oid, err)
		} else if !pack.SameLayout(momR.Layout, baseR.Layout) {
			momR.Close()
			err = fmt.Errorf("outer state %s: %w: layout %s, base params have %s", oid, pack.ErrLayoutMismatch, momR.Layout.Hash(), baseR.Layout.Hash())
		}
	}
	if err != nil {
		baseR.Close()
		return nil, nil, err
	}
	return baseR, momR, nil
}

// inputs reads blocks of the contributions of one merge, one buffer per contribution.
type inputs struct {
	srcs   []*deltaSource
	bufs   [][]float32
	blocks [][]float32
	n, b   int
}

func newInputs(srcs []*deltaSource, n, block int) *inputs {
	return &inputs{srcs: srcs, bufs: make([][]float32, len(srcs)), blocks: make([][]float32, len(srcs)), n: n, b: block}
}

// read returns values [lo, hi) of the contributions in which, indexed like srcs (nil for
// the others); the blocks are valid until the next read.
func (in *inputs) read(lo, hi int, which []int) ([][]float32, error) {
	clear(in.blocks)
	for _, k := range which {
		if in.bufs[k] == nil {
			in.bufs[k] = make([]float32, min(in.b, in.n))
		}
		in.blocks[k] = in.bufs[k][:hi-lo]
		if err := in.srcs[k].read(lo, in.blocks[k]); err != nil {
			return nil, err
		}
	}
	return in.blocks, nil
}

// norms is one pass computing the norms of the contributions in which, with the bits
// screening gives them.
func (in *inputs) norms(ctx context.Context, which []int, workers int) ([]float64, error) {
	s, err := merge.NewScreening(merge.ScreenConfig{}, merge.History{}, len(which), in.n, false, workers)
	if err != nil {
		return nil, err
	}
	sub := make([][]float32, len(which))
	for lo := 0; lo < in.n || lo == 0; lo += in.b {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		hi := min(lo+in.b, in.n)
		blocks, err := in.read(lo, hi, which)
		if err != nil {
			return nil, err
		}
		for j, k := range which {
			sub[j] = blocks[k]
		}
		if err := s.AddNorms(lo, sub); err != nil {
			return nil, err
		}
		if hi == in.n {
			break
		}
	}
	v, err := s.Verdicts()
	if err != nil {
		return nil, err
	}
	norms := make([]float64, len(v))
	for j := range v {
		norms[j] = v[j].Norm
	}
	return norms, nil
}

// step is the third pass: block by block, aggregate the accepted contributions, apply the
// policy to the base parameters (and momentum) and write the next parameters (and
// momentum) to the store. Both artifacts are committed only when every block is written.
func (m *Merger) step(ctx context.Context, B int, layout pack.Layout, baseR, momR *pack.PackReader, n int, accepted []int, weights, norms []float64,
	in *inputs) (paramsID, outerID cid.Cid, err error) {
	diloCo := m.Policy.Kind == "diloco"
	if !diloCo && m.Policy.Kind != "ema" {
		return cid.Undef, cid.Undef, fmt.Errorf("unknown merge policy %q", m.Policy.Kind)
	}
	buffers, paramsMeta, err := bufferRanges(layout, baseR.Header.Metadata)
	if err != nil {
		return cid.Undef, cid.Undef, fmt.Errorf("base params: %w", err)
	}
	pw, err := newPackSink(m.Store, layout, paramsMeta)
	if err != nil {
		return cid.Undef, cid.Undef, err
	}
	defer pw.abort()
	var mw *packSink
	if diloCo {
		if mw, err = newPackSink(m.Store, layout, map[string]string{"kind": "outer_momentum"}); err != nil {
			return cid.Undef, cid.Undef, err
		}
		defer mw.abort()
	}
	bl := min(B, n)
	mean, params, mom, scratch := make([]float32, bl), make([]float32, bl), make([]float32, bl), make([]float32, bl)
	var baseCopy []float32
	if diloCo && len(buffers) > 0 {
		baseCopy = make([]float32, bl)
	}
	xs := make([][]float32, len(accepted))
	for lo := 0; lo < n; lo += B {
		if err := ctx.Err(); err != nil {
			return cid.Undef, cid.Undef, err
		}
		hi := min(lo+B, n)

		blocks, err := in.read(lo, hi, accepted)
		if err != nil {
			return cid.Undef, cid.Undef, err
		}
		for j, k := range accepted {
			xs[j] = blocks[k]
		}
		g, p := mean[:hi-lo], params[:hi-lo]
		if err := merge.AggregateBlock(m.Policy.Aggregator, g, xs, weights, norms, m.Policy.Aggregate, m.Workers); err != nil {
			return cid.Undef, cid.Undef, err
		}
		if err := baseR.ReadValues(int64(lo), p); err != nil {
			return cid.Undef, cid.Undef, err
		}
		if diloCo {
			mb := mom[:hi-lo]
			if momR != nil {
				if err := momR.ReadValues(int64(lo), mb); err != nil {
					return cid.Undef, cid.Undef, err
				}
			} else {
				clear(mb)
			}
			if baseCopy != nil {
				copy(baseCopy, p)
			}
			if err := diloco.OuterStep(p, mb, g, m.Policy.Outer, m.Workers); err != nil {
				return cid.Undef, cid.Undef, err
			}
			if baseCopy != nil {
				averageBuffers(buffers, lo, p, mb, baseCopy[:hi-lo], g)
			}
			if err := mw.write(mb); err != nil {
				return cid.Undef, cid.Undef, err
			}
		} else {
			// The mean of the local models is base − mean Δ; the EMA moves base toward it.
			local := scratch[:hi-lo]
			if err := diloco.PseudoGradient(local, p, g, m.Workers); err != nil {
				return cid.Undef, cid.Undef, err
			}
			next := mean[:hi-lo] // g is no longer needed
			if err := merge.EMA(next, p, local, m.Policy.NewWeight, m.Workers); err != nil {
				return cid.Undef, cid.Undef, err
			}
			p = next
		}
		if i := merge.FirstNonFinite(p, m.Workers); i >= 0 {
			return cid.Undef, cid.Undef, fmt.Errorf("%w: merged parameters hold NaN/Inf in %q", ErrNonFinite, layout.NameAt(int64(lo+i)))
		}
		if err := pw.write(p); err != nil {
			return cid.Undef, cid.Undef, err
		}
	}
	if paramsID, err = pw.commit(); err != nil {
		return cid.Undef, cid.Undef, err
	}
	if mw != nil {
		if outerID, err = mw.commit(); err != nil {
			return cid.Undef, cid.Undef, err
		}
	}
	return paramsID, outerID, nil
}

// buildHead makes the next head from the stored parameters (and outer state) and the
// merged contributions.
func buildHead(policy Policy, base *chain.Head, baseID, paramsID, outerID cid.Cid, merged []Candidate) (*chain.Head, error) {
	contribs := make([]chain.Contribution, len(merged))
	var samples uint64
	var lossSum, wSum float64
	for i, c := range merged {
		contribs[i] = chain.Contribution{Peer: c.Peer, Artifact: c.Delta.Bytes(), Samples: c.Samples,
			Weight: float64(c.Samples) * quality(c), Microshards: c.Microshards, Loss: c.Loss, Ahead: c.Ahead}
		if c.Lease.Defined() {
			contribs[i].Lease = c.Lease.Bytes()
		}
		samples += c.Samples
		lossSum += c.Loss * float64(c.Samples)
		wSum += float64(c.Samples)
	}
	ledger, err := lease.Apply(base.Ledger, contribs)
	if err != nil {
		return nil, err
	}
	h := &chain.Head{
		Version: 1, Network: base.Network, Experiment: base.Experiment, Round: base.Round + 1,
		Parent: baseID.Bytes(), Params: paramsID.Bytes(), LayoutHash: base.LayoutHash,
		Contributions: contribs, Policy: policy.Record(), Ledger: ledger,
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

// packSink streams a pack into the store.
type packSink struct {
	w  *artifact.Writer
	bw *bufio.Writer
	sw *pack.StreamWriter
}

func newPackSink(store *artifact.Store, layout pack.Layout, meta map[string]string) (*packSink, error) {
	w, err := store.Create()
	if err != nil {
		return nil, err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	sw, err := pack.NewStreamWriter(bw, layout, meta)
	if err != nil {
		w.Abort()
		return nil, fmt.Errorf("store pack: %w", err)
	}
	return &packSink{w: w, bw: bw, sw: sw}, nil
}

func (s *packSink) write(v []float32) error {
	if err := s.sw.Write(v); err != nil {
		return fmt.Errorf("store pack: %w", err)
	}
	return nil
}

func (s *packSink) commit() (cid.Cid, error) {
	if err := s.sw.Close(); err != nil {
		return cid.Undef, fmt.Errorf("store pack: %w", err)
	}
	if err := s.bw.Flush(); err != nil {
		return cid.Undef, fmt.Errorf("store pack: %w", err)
	}
	return s.w.Commit()
}

// abort discards the artifact unless it was committed (Abort is a no-op then).
func (s *packSink) abort() { s.w.Abort() }

// HistoryOf is the screening history a head carries (empty for heads made before heads
// carried it, and for genesis).
func HistoryOf(h *chain.Head) merge.History {
	s := h.Metrics.Screen
	if s == nil {
		return merge.History{}
	}
	return merge.History{Rounds: s.Rounds, Norm: s.Norm,
		Cohort: merge.Moments{N: s.CohortN, Mean: s.CohortMean, Var: s.CohortVar},
		Ref:    merge.Moments{N: s.RefN, Mean: s.RefMean, Var: s.RefVar},
		Self:   merge.Moments{N: s.SelfN, Mean: s.SelfMean, Var: s.SelfVar}}
}

func screenStats(h merge.History) *chain.ScreenStats {
	return &chain.ScreenStats{Rounds: h.Rounds, Norm: h.Norm,
		CohortN: h.Cohort.N, CohortMean: h.Cohort.Mean, CohortVar: h.Cohort.Var,
		RefN: h.Ref.N, RefMean: h.Ref.Mean, RefVar: h.Ref.Var,
		SelfN: h.Self.N, SelfMean: h.Self.Mean, SelfVar: h.Self.Var}
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
	_, meta, err := bufferRanges(p.Layout, p.Meta)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("genesis: %w", err)
	}
	m := &Merger{Store: store}
	paramsID, err := m.storePack(p.Layout, p.Values, meta)
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
