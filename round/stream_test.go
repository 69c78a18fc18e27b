package round

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/internal/parallel"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
)

// mergeInMemory is the merge as it was before streaming: every contribution decoded whole,
// screened, aggregated and stepped on whole vectors. The streaming Merge must give the
// same head, bit for bit.
func mergeInMemory(t *testing.T, m *Merger, baseID cid.Cid, base *chain.Head, cands []Candidate) (cid.Cid, []Rejection) {
	t.Helper()
	cands = slices.Clone(cands)
	slices.SortFunc(cands, func(a, b Candidate) int { return strings.Compare(a.Peer, b.Peer) })
	paramsID, err := base.ParamsID()
	require.NoError(t, err)
	basePack, err := pack.Load(m.Store.BlobPath(paramsID))
	require.NoError(t, err)
	defer basePack.Close()
	n := len(basePack.Values)
	var rejected []Rejection
	var deltas [][]float32
	var kept []Candidate
	for _, c := range cands {
		blob, err := m.Store.Open(c.Delta)
		require.NoError(t, err)
		enc, err := ParseDelta(blob.Bytes(), basePack.Layout.Hash(), n)
		if err != nil {
			blob.Close()
			rejected = append(rejected, Rejection{Peer: c.Peer, Reason: "malformed"})
			continue
		}
		if m.Policy.checkWire(enc, base.Round+1) != nil {
			blob.Close()
			rejected = append(rejected, Rejection{Peer: c.Peer, Reason: ReasonWrongCodec})
			continue
		}
		d := make([]float32, n)
		require.NoError(t, diloco.Decode(enc, d, 1))
		blob.Close()
		deltas = append(deltas, d)
		kept = append(kept, c)
	}
	var momentum []float32
	if m.Policy.Kind == "diloco" {
		momentum = make([]float32, n)
		if oid, _ := base.OuterStateID(); oid.Defined() {
			mp, err := pack.Load(m.Store.BlobPath(oid))
			require.NoError(t, err)
			copy(momentum, mp.Values)
			mp.Close()
		}
	}
	var ref []float32
	if oid, _ := base.OuterStateID(); oid.Defined() && m.Policy.Screen.MinCosine != nil {
		ref = momentum
	}
	hist := HistoryOf(base)
	verdicts, err := merge.ScreenWith(deltas, ref, hist, m.Policy.Screen, 1)
	require.NoError(t, err)
	var xs [][]float32
	var weights []float64
	var merged []Candidate
	var mv []merge.Verdict
	for i, v := range verdicts {
		if !v.Accepted {
			rejected = append(rejected, Rejection{Peer: kept[i].Peer, Reason: string(v.Reason)})
			continue
		}
		xs = append(xs, deltas[i])
		weights = append(weights, float64(kept[i].Samples)*quality(kept[i]))
		merged = append(merged, kept[i])
		mv = append(mv, v)
	}
	require.NotEmpty(t, xs)
	mean := make([]float32, n)
	require.NoError(t, merge.Aggregate(m.Policy.Aggregator, mean, xs, weights, m.Policy.Aggregate, 1))
	params := slices.Clone(basePack.Values)
	var outerID cid.Cid
	if m.Policy.Kind == "diloco" {
		require.NoError(t, diloco.OuterStep(params, momentum, mean, m.Policy.Outer, 1))
		ranges, _, err := bufferRanges(basePack.Layout, basePack.Meta)
		require.NoError(t, err)
		averageBuffers(ranges, 0, params, momentum, basePack.Values, mean)
		outerID, err = m.storePack(basePack.Layout, momentum, map[string]string{"kind": "outer_momentum"})
		require.NoError(t, err)
	} else {
		local := make([]float32, n)
		require.NoError(t, diloco.PseudoGradient(local, basePack.Values, mean, 1))
		require.NoError(t, merge.EMA(params, basePack.Values, local, m.Policy.NewWeight, 1))
	}
	_, meta, err := bufferRanges(basePack.Layout, basePack.Meta)
	require.NoError(t, err)
	pid, err := m.storePack(basePack.Layout, params, meta)
	require.NoError(t, err)
	h, err := buildHead(m.Policy, base, baseID, pid, outerID, merged)
	require.NoError(t, err)
	h.Metrics.Screen = screenStats(hist.Next(mv))
	id, err := h.ID()
	require.NoError(t, err)
	slices.SortFunc(rejected, func(a, b Rejection) int { return strings.Compare(a.Peer, b.Peer) })
	return id, rejected
}

// bigGenesis stores a genesis head whose pack has n values over three tensors, so blocks
// straddle tensor boundaries; the small one is a buffer.
func bigGenesis(t *testing.T, store *artifact.Store, n int, policy Policy, seed uint64) (*chain.Head, cid.Cid) {
	t.Helper()
	a := int64(n / 3)
	layout := pack.Layout{{Name: "a", Shape: []int64{a}}, {Name: "b", Shape: []int64{3, 7}}, {Name: "c", Shape: []int64{int64(n) - a - 21}}}
	rng := rand.New(rand.NewPCG(seed, 3))
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64())
	}
	p, err := pack.New(layout, vals, map[string]string{BuffersMeta: "b"})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "init.safetensors")
	require.NoError(t, p.WriteFile(path))
	gen, id, err := Genesis(store, path, "net", "exp", "plan", 64, policy)
	require.NoError(t, err)
	return gen, id
}

// syntheticCohort stores honest deltas around a shared direction plus attackers.
func syntheticCohort(t *testing.T, store *artifact.Store, layoutHash string, n int, codec diloco.Codec, block int, round int, honest int, attackers bool) []Candidate {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(round), 17))
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(0.01 * rng.NormFloat64())
	}
	var out []Candidate
	add := func(name string, d []float32) {
		enc, err := diloco.Encode(codec, d, nil, block, 2)
		if err != nil && codec == diloco.FP16 { // non-finite: an fp16 NaN in the last value
			finite := slices.Clone(d)
			finite[n-1] = 0
			enc, err = diloco.Encode(codec, finite, nil, block, 2)
			require.NoError(t, err)
			enc.Data[2*n-2], enc.Data[2*n-1] = 0x00, 0x7e
		} else if err != nil {
			// The other codecs cannot carry a NaN (their scales must be finite): an fp32
			// payload, which an fp32 policy screens and the others refuse as wrong_codec.
			enc = diloco.Encoded{Codec: diloco.FP32, N: n, Data: pack.Float32Bytes(d)}
		}
		id, err := StoreDelta(store, enc, layoutHash)
		require.NoError(t, err)
		out = append(out, Candidate{Peer: name, Delta: id, Samples: uint64(10 + len(out)), Microshards: []uint32{uint32(10*round + len(out))}, Loss: 1})
	}
	var first []float32
	for k := range honest {
		d := make([]float32, n)
		for i := range d {
			d[i] = g[i] + float32(0.01*rng.NormFloat64())
		}
		if k == 0 {
			first = d
		}
		add(fmt.Sprintf("h%d", k), d)
	}
	if attackers {
		flip, big, nan := make([]float32, n), make([]float32, n), slices.Clone(first)
		for i := range first {
			flip[i], big[i] = -first[i], 1000*first[i]
		}
		nan[n-1] = float32(math.NaN())
		add("x-flip", flip)
		add("y-big", big)
		add("z-nan", nan)
	}
	return out
}

// TestStreamingMergeMatchesInMemory: for every aggregator and codec, over several rounds
// (so that momentum and screening history come into play, and a last round with two
// contributions screened against them), the streaming merge makes the head the
// whole-vector merge makes, with the same rejections.
func TestStreamingMergeMatchesInMemory(t *testing.T) {
	// Blocks of one chunk keep the test fast; n spans three blocks and a ragged end.
	block := parallel.ChunkLen
	n := 2*block + 12345
	type codecCase struct {
		codec diloco.Codec
		block int
	}
	codecs := []codecCase{{diloco.FP32, 0}, {diloco.FP16, 0}, {diloco.Int8, 256}, {diloco.Int8, 100}, {diloco.Sparse, 4096}, {diloco.Sparse, 1000}}
	for _, agg := range merge.Aggregators() {
		for _, cc := range codecs {
			if (cc.codec == diloco.Sparse || cc.block == 100) && agg != merge.AggMean && agg != merge.AggNormClip {
				continue // the odd codecs with the two aggregators that differ most, to keep -race quick
			}
			kinds := []string{"diloco"}
			if agg == merge.AggMean && cc.codec == diloco.FP32 {
				kinds = append(kinds, "ema")
			}
			for _, kind := range kinds {
				t.Run(fmt.Sprintf("%s/%s-%d/%s", agg, cc.codec, cc.block, kind), func(t *testing.T) {
					t.Parallel()
					store, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
					require.NoError(t, err)
					policy := Policy{Kind: kind, Outer: diloco.OuterConfig{LR: 1, Momentum: 0.5, Nesterov: true}, NewWeight: 0.5, Aggregator: agg,
						Aggregate: merge.AggregateOptions{TrimFraction: 0.2},
						Screen:    merge.ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}, Codec: cc.codec}
					switch cc.codec {
					case diloco.Int8:
						policy.Int8Block = cc.block
					case diloco.Sparse:
						policy.Sparse.Block = cc.block
					}
					base, baseID := bigGenesis(t, store, n, policy, 1)
					m := &Merger{Store: store, Policy: policy, Workers: 2, Block: block}
					for r := 1; r <= 3; r++ {
						honest, attackers := 5, true
						if r == 3 {
							honest, attackers = 2, false
						}
						cands := syntheticCohort(t, store, base.LayoutHash, n, cc.codec, cc.block, r, honest, attackers)
						out, err := m.Merge(context.Background(), baseID, base, cands)
						require.NoError(t, err)
						want, wantRej := mergeInMemory(t, m, baseID, base, cands)
						require.True(t, want.Equals(out.ID), "round %d: streaming %s, in memory %s", r, out.ID, want)
						var got []Rejection
						for _, rj := range out.Rejected {
							got = append(got, Rejection{Peer: rj.Peer, Reason: rj.Reason})
						}
						slices.SortFunc(got, func(a, b Rejection) int { return strings.Compare(a.Peer, b.Peer) })
						require.Equal(t, wantRej, got, "round %d", r)
						if attackers && cc.codec != diloco.Sparse {
							require.Len(t, got, 3, "round %d: the three attackers are out", r)
						}
						base, baseID = out.Head, out.ID
					}
				})
			}
		}
	}
}

// TestStreamingMergeBadBlobs: a contribution whose blob on disk is shorter than its
// manifest, or whose header declares a length the bytes do not have, is rejected as
// malformed naming the artifact; the round goes on with the others and nothing is left
// half-written in the store.
func TestStreamingMergeBadBlobs(t *testing.T) {
	n := StreamBlock + 100
	store, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	require.NoError(t, err)
	base, baseID := bigGenesis(t, store, n, dilocoPolicy, 2)
	cands := syntheticCohort(t, store, base.LayoutHash, n, diloco.FP32, 0, 1, 4, false)
	// Truncate one blob in the store.
	require.NoError(t, os.Truncate(store.BlobPath(cands[1].Delta), 1000))
	// A delta whose header claims n values but holds n−1.
	short := diloco.Encoded{Codec: diloco.FP32, N: n - 1, Data: make([]byte, 4*(n-1))}
	sid, err := StoreDelta(store, short, base.LayoutHash)
	require.NoError(t, err)
	cands = append(cands, Candidate{Peer: "short", Delta: sid, Samples: 5, Microshards: []uint32{40}})
	before, err := os.ReadDir(filepath.Join(store.Dir(), "tmp"))
	require.NoError(t, err)
	out, err := (&Merger{Store: store, Policy: dilocoPolicy}).Merge(context.Background(), baseID, base, cands)
	require.NoError(t, err)
	reasons := map[string]string{}
	for _, r := range out.Rejected {
		reasons[r.Peer] = r.Reason + ": " + r.Detail
	}
	require.Len(t, reasons, 2)
	require.Contains(t, reasons[cands[1].Peer], cands[1].Delta.String())
	require.Contains(t, reasons[cands[1].Peer], "malformed")
	require.Contains(t, reasons["short"], "malformed")
	require.Len(t, out.Head.Contributions, 3)
	after, err := os.ReadDir(filepath.Join(store.Dir(), "tmp"))
	require.NoError(t, err)
	require.Equal(t, len(before), len(after), "no temporary files left behind")
}
