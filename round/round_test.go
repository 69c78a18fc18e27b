package round

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/lease"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
	"github.com/p2pnode/p2pnode/synth"
)

type fixture struct {
	store  *artifact.Store
	rt     *synth.Runtime
	shards *shardPaths
	genID  cid.Cid
	gen    *chain.Head
	sparse diloco.SparseShape // the policy's: the trainers encode with it
}

type shardPaths struct {
	plan *dataset.Plan
	ss   *dataset.ShardStore
}

func (s *shardPaths) Paths(ctx context.Context, ms []uint32) ([]string, error) {
	var out []string
	for _, i := range ms {
		p, err := s.ss.Paths(ctx, s.plan.Shards[i])
		if err != nil {
			return nil, err
		}
		out = append(out, p...)
	}
	return out, nil
}

var dilocoPolicy = Policy{Kind: "diloco", Outer: diloco.OuterConfig{LR: 0.7, Momentum: 0.9, Nesterov: true},
	Aggregator: merge.AggMean, Codec: diloco.FP32, Screen: merge.ScreenConfig{MaxNormRatio: 10}}

// withCodec is p for contributions in codec, as the fixture's trainers encode them.
func withCodec(p Policy, codec diloco.Codec) Policy {
	p.Codec = codec
	if codec == diloco.Int8 {
		p.Int8Block = 16
	}
	return p
}

func newFixture(t *testing.T, policy Policy) *fixture {
	t.Helper()
	dir := t.TempDir()
	store, err := artifact.OpenStore(filepath.Join(dir, "store"), artifact.Options{})
	require.NoError(t, err)
	data := filepath.Join(dir, "data")
	require.NoError(t, synth.WriteDataset(data, 8, 3))
	m, err := dataset.Build(data, "synth", 0)
	require.NoError(t, err)
	plan, err := dataset.NewPlan(m, 256)
	require.NoError(t, err)
	ss, err := dataset.NewShardStore(store, data, m, nil)
	require.NoError(t, err)
	rt := synth.New(filepath.Join(dir, "scratch"))
	_, err = rt.Start(context.Background())
	require.NoError(t, err)
	init := filepath.Join(dir, "scratch", "init.safetensors")
	require.NoError(t, rt.Init(context.Background(), 1, init))
	gen, genID, err := Genesis(store, init, "net", "exp", plan.ID().String(), len(plan.Shards), policy)
	require.NoError(t, err)
	return &fixture{store: store, rt: rt, shards: &shardPaths{plan: plan, ss: ss}, genID: genID, gen: gen, sparse: policy.Sparse}
}

func (f *fixture) trainer(codec diloco.Codec) *Trainer {
	return &Trainer{Runtime: f.rt, Store: f.store, Shards: f.shards, Codec: codec, Int8Block: 16, Sparse: f.sparse}
}

func (f *fixture) candidates(t *testing.T, codec diloco.Codec, peers map[string][]uint32) []Candidate {
	t.Helper()
	var out []Candidate
	for p, ms := range peers {
		res, err := f.trainer(codec).Train(context.Background(), f.gen, ms, 5, 7)
		require.NoError(t, err)
		out = append(out, Candidate{Peer: p, Delta: res.Delta, Samples: res.Samples, Microshards: ms, Loss: res.Loss})
	}
	return out
}

func TestMergeIsDeterministicAcrossValidators(t *testing.T) {
	for _, codec := range []diloco.Codec{diloco.FP32, diloco.FP16, diloco.Int8, diloco.Sparse} {
		t.Run(string(codec), func(t *testing.T) {
			policy := withCodec(dilocoPolicy, codec)
			f := newFixture(t, policy)
			cands := f.candidates(t, codec, map[string][]uint32{"a": {0, 1}, "b": {2}, "c": {3, 4}})
			m1 := &Merger{Store: f.store, Policy: policy, Workers: 1}
			m2 := &Merger{Store: f.store, Policy: policy, Workers: 3}
			o1, err := m1.Merge(context.Background(), f.genID, f.gen, cands)
			require.NoError(t, err)
			rev := []Candidate{cands[2], cands[0], cands[1]}
			o2, err := m2.Merge(context.Background(), f.genID, f.gen, rev)
			require.NoError(t, err)
			require.True(t, o1.ID.Equals(o2.ID), "same inputs, same head CID, whatever the order and goroutines")
			require.Len(t, o1.Head.Contributions, 3)
			require.NotEmpty(t, o1.Head.OuterState, "diloco keeps its momentum in the head")
			rep, err := lease.Audit([]*chain.Head{f.gen, o1.Head})
			require.NoError(t, err)
			require.Equal(t, uint64(5), rep.MicroshardsMerged)
		})
	}
}

func TestMergeImprovesTheModel(t *testing.T) {
	for _, policy := range []Policy{dilocoPolicy, {Kind: "ema", NewWeight: 0.8, Aggregator: merge.AggMean, Codec: diloco.FP32}} {
		t.Run(policy.Kind, func(t *testing.T) {
			f := newFixture(t, policy)
			cands := f.candidates(t, diloco.FP32, map[string][]uint32{"a": {0, 1}, "b": {2, 3}})
			out, err := (&Merger{Store: f.store, Policy: policy}).Merge(context.Background(), f.genID, f.gen, cands)
			require.NoError(t, err)
			before := f.eval(t, f.gen)
			after := f.eval(t, out.Head)
			require.Less(t, after, before)
		})
	}
}

func (f *fixture) eval(t *testing.T, h *chain.Head) float64 {
	id, err := h.ParamsID()
	require.NoError(t, err)
	m, err := f.rt.Evaluate(context.Background(), f.store.BlobPath(id))
	require.NoError(t, err)
	return m["mse"]
}

// storeFakeDelta stores an fp32 delta with the given values for the genesis layout.
func (f *fixture) storeFakeDelta(t *testing.T, vals []float32) cid.Cid {
	t.Helper()
	enc, err := diloco.Encode(diloco.FP32, vals, nil, 0, 1)
	if err != nil { // Encode refuses non-finite input: build the payload by hand
		enc = diloco.Encoded{Codec: diloco.FP32, N: len(vals), Data: pack.Float32Bytes(vals)}
	}
	id, err := StoreDelta(f.store, enc, f.gen.LayoutHash)
	require.NoError(t, err)
	return id
}

func TestScreeningKeepsBadUpdatesOut(t *testing.T) {
	f := newFixture(t, dilocoPolicy)
	honest := f.candidates(t, diloco.FP32, map[string][]uint32{"a": {0}, "b": {1}, "c": {2}})
	n := int(synth.Layout().Params())
	nan := make([]float32, n)
	nan[3] = float32(math.NaN())
	huge := make([]float32, n)
	for i := range huge {
		huge[i] = 1000
	}
	wrongLayout, err := StoreDelta(f.store, diloco.Encoded{Codec: diloco.FP32, N: 2, Data: make([]byte, 8)}, "0000")
	require.NoError(t, err)
	bad := []Candidate{
		{Peer: "x-nan", Delta: f.storeFakeDelta(t, nan), Samples: 10, Microshards: []uint32{4}},
		{Peer: "y-huge", Delta: f.storeFakeDelta(t, huge), Samples: 10, Microshards: []uint32{5}},
		{Peer: "z-layout", Delta: wrongLayout, Samples: 10, Microshards: []uint32{6}},
	}
	out, err := (&Merger{Store: f.store, Policy: dilocoPolicy}).Merge(context.Background(), f.genID, f.gen, append(honest, bad...))
	require.NoError(t, err)
	reasons := map[string]string{}
	for _, r := range out.Rejected {
		reasons[r.Peer] = r.Reason
	}
	require.Equal(t, map[string]string{"x-nan": "non_finite", "y-huge": "norm_outlier", "z-layout": "malformed"}, reasons)
	require.Len(t, out.Head.Contributions, 3)
	for _, c := range out.Head.Contributions {
		require.NotContains(t, []string{"x-nan", "y-huge", "z-layout"}, c.Peer)
	}

	_, err = (&Merger{Store: f.store, Policy: dilocoPolicy}).Merge(context.Background(), f.genID, f.gen, bad[:1])
	require.ErrorIs(t, err, ErrNothingMerged)
}

func TestTrainerRefusesNonFiniteWorkerOutput(t *testing.T) {
	f := newFixture(t, dilocoPolicy)
	tr := f.trainer(diloco.FP32)
	f.rt.Hook = nil
	res, err := tr.Train(context.Background(), f.gen, []uint32{0}, 5, 1)
	require.NoError(t, err)
	require.Greater(t, res.DeltaNorm, 0.0)

	// A base head whose params are missing names the artifact.
	missing := *f.gen
	missing.Params = cids.Record([]byte("nothing")).Bytes()
	_, err = tr.Train(context.Background(), &missing, []uint32{0}, 5, 1)
	require.ErrorIs(t, err, artifact.ErrNotFound)
}

func TestDeltaFileRoundTrip(t *testing.T) {
	f := newFixture(t, dilocoPolicy)
	vals := []float32{1, -2, 3.5, 0, 1e-3}
	for _, codec := range []diloco.Codec{diloco.FP32, diloco.FP16, diloco.Int8, diloco.Sparse} {
		enc, err := diloco.Encode(codec, vals, nil, 2, 1)
		require.NoError(t, err)
		id, err := StoreDelta(f.store, enc, "layout")
		require.NoError(t, err)
		b, err := f.store.ReadAll(id)
		require.NoError(t, err)
		got, err := ParseDelta(b, "layout", len(vals))
		require.NoError(t, err)
		require.Equal(t, enc, got)
		_, err = ParseDelta(b, "other", len(vals))
		require.ErrorIs(t, err, pack.ErrLayoutMismatch)
		_, err = ParseDelta(b, "layout", len(vals)+1)
		require.Error(t, err)
	}
}

func FuzzParseDelta(f *testing.F) {
	for _, codec := range []diloco.Codec{diloco.FP32, diloco.FP16, diloco.Int8, diloco.Sparse} {
		enc, _ := diloco.Encode(codec, []float32{1, 2, 3, 4}, nil, 2, 1)
		dir := f.TempDir()
		store, _ := artifact.OpenStore(dir, artifact.Options{})
		id, _ := StoreDelta(store, enc, "L")
		b, _ := store.ReadAll(id)
		f.Add(b, 4)
	}
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		e, err := ParseDelta(b, "L", n)
		if err != nil {
			return
		}
		dst := make([]float32, n)
		_ = diloco.Decode(e, dst, 1)
	})
}
