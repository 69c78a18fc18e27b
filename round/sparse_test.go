package round

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
)

// A trainer on the sparse codec sends ≤ 1 % of its pseudo-gradient's coordinates per block
// and keeps the rest: residual + decoded = the true delta. A second window adds the
// residual back (the residual carries over), and a change of codec settings or of the
// model's layout starts it again from zeros.
func TestSparseTrainerKeepsResidual(t *testing.T) {
	f := newFixture(t, dilocoPolicy)
	tr := f.trainer(diloco.Sparse)
	tr.Sparse.Block, tr.Sparse.TopK = 64, 2
	res, err := tr.Train(context.Background(), f.gen, []uint32{0, 1}, 5, 7)
	require.NoError(t, err)
	require.NotEmpty(t, tr.Residual)
	require.Equal(t, ResidualTag(diloco.Sparse, 64, 2, f.gen.LayoutHash), tr.ResidualTag)
	require.Positive(t, res.ResidualNorm)
	require.Equal(t, merge.Norm(tr.Residual, 1), res.ResidualNorm, "the result reports the residual the trainer keeps")

	b, err := f.store.ReadAll(res.Delta)
	require.NoError(t, err)
	enc, err := ParseDelta(b, f.gen.LayoutHash, len(tr.Residual))
	require.NoError(t, err)
	require.Equal(t, diloco.Sparse, enc.Codec)
	dec := make([]float32, enc.N)
	require.NoError(t, diloco.Decode(enc, dec, 1))
	nonZero := 0
	var sumSq float64
	for i, v := range dec {
		if v != 0 {
			nonZero++
		}
		x := float64(v) + float64(tr.Residual[i])
		sumSq += x * x
	}
	blocks := (enc.N + 63) / 64
	require.LessOrEqual(t, nonZero, 2*blocks)
	require.Greater(t, nonZero, 0)
	require.InDelta(t, res.DeltaNorm, math.Sqrt(sumSq), 1e-4*res.DeltaNorm, "decoded + residual is the delta")

	first := append([]float32(nil), tr.Residual...)
	_, err = tr.Train(context.Background(), f.gen, []uint32{2}, 5, 8)
	require.NoError(t, err)
	require.NotEqual(t, first, tr.Residual)

	tr.Sparse.TopK = 3 // a new setting: the old remainder means nothing to it
	tr.Residual = first
	_, err = tr.Train(context.Background(), f.gen, []uint32{3}, 5, 9)
	require.NoError(t, err)
	require.Equal(t, ResidualTag(diloco.Sparse, 64, 3, f.gen.LayoutHash), tr.ResidualTag)

	// fp32 has no error feedback and leaves the residual alone.
	tr.Codec = diloco.FP32
	kept := append([]float32(nil), tr.Residual...)
	_, err = tr.Train(context.Background(), f.gen, []uint32{4}, 5, 9)
	require.NoError(t, err)
	require.Equal(t, kept, tr.Residual)
}

func TestResidualTagResetRules(t *testing.T) {
	base := ResidualTag(diloco.Sparse, 4096, 64, "L")
	require.Equal(t, base, ResidualTag(diloco.Sparse, 0, 0, "L"), "defaults spelled out or not")
	for _, other := range []string{
		ResidualTag(diloco.Sparse, 2048, 64, "L"),
		ResidualTag(diloco.Sparse, 4096, 32, "L"),
		ResidualTag(diloco.Sparse, 4096, 64, "M"),
		ResidualTag(diloco.Int8, 4096, 0, "L"),
	} {
		require.NotEqual(t, base, other)
	}
}

func TestResidualFileRoundTrip(t *testing.T) {
	r := []float32{1, -0.5, 0, 3e-8}
	b, err := EncodeResidual(r, "sparse/4096/64/L")
	require.NoError(t, err)
	got, tag, err := ParseResidual(b)
	require.NoError(t, err)
	require.Equal(t, r, got)
	require.Equal(t, "sparse/4096/64/L", tag)

	nan, err := EncodeResidual([]float32{1, float32(math.NaN())}, "t")
	require.NoError(t, err)
	_, _, err = ParseResidual(nan)
	require.ErrorContains(t, err, "element 1 is NaN")

	var other bytes.Buffer
	require.NoError(t, pack.Write(&other, []pack.Tensor{{Name: "residual", DType: pack.F32, Shape: []int64{1}, Data: make([]byte, 4)}}, map[string]string{"format": "p2ptrain-pack/1"}))
	_, _, err = ParseResidual(other.Bytes())
	require.ErrorContains(t, err, "p2ptrain-residual/1")
	_, _, err = ParseResidual(pack.Float32Bytes(r)) // the raw bytes an older node wrote
	require.Error(t, err)
}

// WriteResidual streams the bytes EncodeResidual returns; ReadResidual reads them back
// from a file, refusing the same damage ParseResidual does and naming the file.
func TestResidualStreamedFile(t *testing.T) {
	dir := t.TempDir()
	r := []float32{1, -0.5, 0, 3e-8}
	want, err := EncodeResidual(r, "int8/256/0/L")
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, WriteResidual(&buf, r, "int8/256/0/L"))
	require.Equal(t, want, buf.Bytes())
	path := filepath.Join(dir, "res")
	require.NoError(t, os.WriteFile(path, want, 0o600))
	got, tag, err := ReadResidual(path)
	require.NoError(t, err)
	require.Equal(t, r, got)
	require.Equal(t, "int8/256/0/L", tag)

	require.NoError(t, os.WriteFile(path, want[:len(want)-3], 0o600)) // truncated
	_, _, err = ReadResidual(path)
	require.ErrorContains(t, err, path)
	nan, err := EncodeResidual([]float32{1, float32(math.NaN())}, "t")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, nan, 0o600))
	_, _, err = ReadResidual(path)
	require.ErrorContains(t, err, "element 1 is NaN")
	require.ErrorContains(t, err, path)
}

func FuzzParseResidual(f *testing.F) {
	b, _ := EncodeResidual([]float32{1, 2, 3}, "sparse/4096/64/L")
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, _, err := ParseResidual(b)
		if err != nil {
			return
		}
		for i, v := range r {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("element %d is %v", i, v)
			}
		}
	})
}

// A sparse contribution whose index is corrupt (positions out of order) is rejected as
// malformed with its artifact named, never merged; the honest ones are.
func TestMergeRejectsMalformedSparse(t *testing.T) {
	policy := withCodec(dilocoPolicy, diloco.Sparse)
	f := newFixture(t, policy)
	honest := f.candidates(t, diloco.Sparse, map[string][]uint32{"a": {0, 1}, "b": {2}})
	b, err := f.store.ReadAll(honest[0].Delta)
	require.NoError(t, err)
	n := 0
	{
		id, err := f.gen.ParamsID()
		require.NoError(t, err)
		p, err := pack.Load(f.store.BlobPath(id))
		require.NoError(t, err)
		n = len(p.Values)
		p.Close()
	}
	enc, err := ParseDelta(b, f.gen.LayoutHash, n)
	require.NoError(t, err)
	bad := enc
	bad.Index = append([]byte(nil), enc.Index...)
	// Flip the last index byte: the last block's upper bitmap and padding, so it no longer
	// holds exactly k positions with zero padding (checked below with diloco.Decode).
	bad.Index[len(bad.Index)-1] ^= 0xff
	id, err := StoreDelta(f.store, bad, f.gen.LayoutHash)
	require.NoError(t, err)
	cands := append(honest, Candidate{Peer: "z-bad", Delta: id, Samples: 10, Microshards: []uint32{5}})
	out, err := (&Merger{Store: f.store, Policy: policy}).Merge(context.Background(), f.genID, f.gen, cands)
	require.NoError(t, err)
	require.Len(t, out.Rejected, 1)
	require.Equal(t, "z-bad", out.Rejected[0].Peer)
	require.Equal(t, "malformed", out.Rejected[0].Reason)
	require.Contains(t, out.Rejected[0].Detail, id.String())
	require.ErrorIs(t, diloco.Decode(bad, make([]float32, n), 1), diloco.ErrMalformed)
	require.Len(t, out.Head.Contributions, 2)
}

// A trainer that holds the base head's artifacts and the round's (sparse) contributions
// rebuilds the next head's parameters and outer state bit for bit — two rounds running, so
// the second starts from a momentum it rebuilt itself — without the dense downloads; a head
// that does not match what its contributions give is refused and leaves nothing behind.
func TestRebuildMatchesTheMerge(t *testing.T) {
	policy := withCodec(dilocoPolicy, diloco.Sparse)
	f := newFixture(t, policy)
	m := &Merger{Store: f.store, Policy: policy}
	own, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	require.NoError(t, err)
	copyIn := func(b []byte) {
		id, err := cid.Cast(b)
		require.NoError(t, err)
		data, err := f.store.ReadAll(id)
		require.NoError(t, err)
		got, err := own.PutBytes(data)
		require.NoError(t, err)
		require.True(t, got.Equals(id))
	}
	copyIn(f.gen.Params)
	rebuilder := &Merger{Store: own, Policy: policy}

	baseID, base := f.genID, f.gen
	for r := 1; r <= 2; r++ {
		var cands []Candidate
		for i, p := range []string{"a", "b", "c"} {
			tr := f.trainer(diloco.Sparse)
			res, err := tr.Train(context.Background(), base, []uint32{uint32(3*(r-1) + i)}, 5, int64(r))
			require.NoError(t, err)
			cands = append(cands, Candidate{Peer: p, Delta: res.Delta, Samples: res.Samples, Microshards: []uint32{uint32(3*(r-1) + i)}})
		}
		out, err := m.Merge(context.Background(), baseID, base, cands)
		require.NoError(t, err)
		next := out.Head
		require.False(t, own.Has(mustCast(t, next.Params)))
		err = rebuilder.Rebuild(context.Background(), baseID, base, next)
		require.ErrorIs(t, err, artifact.ErrNotFound, "contributions not fetched yet")
		for _, c := range next.Contributions {
			copyIn(c.Artifact)
		}

		tampered := *next
		tampered.Contributions = append([]chain.Contribution(nil), next.Contributions...)
		tampered.Contributions[0].Weight *= 2
		before, err := own.List()
		require.NoError(t, err)
		require.ErrorIs(t, rebuilder.Rebuild(context.Background(), baseID, base, &tampered), ErrMismatch)
		after, err := own.List()
		require.NoError(t, err)
		require.ElementsMatch(t, before, after, "a failed rebuild leaves nothing behind")

		require.NoError(t, rebuilder.Rebuild(context.Background(), baseID, base, next))
		require.True(t, own.Has(mustCast(t, next.Params)))
		require.True(t, own.Has(mustCast(t, next.OuterState)))
		require.NoError(t, own.Verify(mustCast(t, next.Params)))
		baseID, base = out.ID, next
	}
}

func mustCast(t *testing.T, b []byte) cid.Cid {
	t.Helper()
	id, err := cid.Cast(b)
	require.NoError(t, err)
	return id
}

// With protocol.sparse_feedback_decay β the value encoded is delta + β·residual: decoded and
// the new residual add up to the window's delta plus the decayed old residual, for plain
// error feedback (1), the default (0, which is diloco.DefaultFeedbackDecay) and a strong
// decay.
func TestSparseTrainerDecaysResidual(t *testing.T) {
	for _, tc := range []struct {
		name           string
		decay, applied float64
	}{
		{"plain error feedback", 1, 1},
		{"default", 0, diloco.DefaultFeedbackDecay},
		{"strong decay", 0.25, 0.25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, dilocoPolicy)
			tr := f.trainer(diloco.Sparse)
			tr.Sparse.Block, tr.Sparse.TopK, tr.FeedbackDecay = 64, 2, tc.decay
			_, err := tr.Train(context.Background(), f.gen, []uint32{0}, 5, 7)
			require.NoError(t, err)
			old := append([]float32(nil), tr.Residual...)
			res, err := tr.Train(context.Background(), f.gen, []uint32{1}, 5, 8)
			require.NoError(t, err)
			b, err := f.store.ReadAll(res.Delta)
			require.NoError(t, err)
			enc, err := ParseDelta(b, f.gen.LayoutHash, len(old))
			require.NoError(t, err)
			dec := make([]float32, enc.N)
			require.NoError(t, diloco.Decode(enc, dec, 1))
			var sumSq float64
			for i, v := range dec {
				x := float64(v) + float64(tr.Residual[i]) - float64(float32(tc.applied)*old[i])
				sumSq += x * x
			}
			require.InDelta(t, res.DeltaNorm, math.Sqrt(sumSq), 1e-4*res.DeltaNorm, "decoded + residual − β·old residual is the delta")
		})
	}
}

// With a top-k warm-up the first round's window keeps topK × factor values per block; the
// pack carries that top-k and decodes like any other; the residual stays the one of the
// configured codec settings (the warm-up does not reset it).
func TestSparseTrainerWarmup(t *testing.T) {
	f := newFixture(t, dilocoPolicy)
	tr := f.trainer(diloco.Sparse)
	tr.Sparse = diloco.SparseShape{Block: 64, TopK: 2, Warmup: 2, WarmupFactor: 4}
	res, err := tr.Train(context.Background(), f.gen, []uint32{0, 1}, 5, 7)
	require.NoError(t, err)
	require.Equal(t, ResidualTag(diloco.Sparse, 64, 2, f.gen.LayoutHash), tr.ResidualTag)
	b, err := f.store.ReadAll(res.Delta)
	require.NoError(t, err)
	enc, err := ParseDelta(b, f.gen.LayoutHash, len(tr.Residual))
	require.NoError(t, err)
	require.Equal(t, diloco.SparseWarmupTopK(2, 64, 2, 4, f.gen.Round+1), enc.TopK)
	require.Equal(t, 8, enc.TopK)
	dec := make([]float32, enc.N)
	require.NoError(t, diloco.Decode(enc, dec, 1))
	nonZero := 0
	for _, v := range dec {
		if v != 0 {
			nonZero++
		}
	}
	blocks := (enc.N + 63) / 64
	require.LessOrEqual(t, nonZero, 8*blocks)
	require.Greater(t, nonZero, 2*blocks, "the warm-up sends more than sparse_topk per block")
	require.Equal(t, 2, tr.Sparse.TopKFor(3), "past the warm-up: sparse_topk")
}

// A contribution is held to the experiment's encoding (Policy.Codec, Int8Block, Sparse): a
// decoder reads any codec, so without the check a dense update in a sparse swarm — or a
// sparse one keeping every value — would be merged, and fetched by every validator at
// many times a sparse update's bytes.
func TestMergeRejectsTheWrongCodec(t *testing.T) {
	sparse := withCodec(dilocoPolicy, diloco.Sparse)
	// Round 1 keeps 2 × 4 = 8 values per block of 64, round 2 about 4, then 2.
	sparse.Sparse = diloco.SparseShape{Block: 64, TopK: 2, Warmup: 2, WarmupFactor: 4}
	int8s := withCodec(dilocoPolicy, diloco.Int8)
	encode := func(codec diloco.Codec, block, k int) func(d []float32) (diloco.Encoded, error) {
		return func(d []float32) (diloco.Encoded, error) {
			if codec == diloco.Sparse {
				return diloco.EncodeSparse(d, nil, block, k, 1, 1)
			}
			return diloco.Encode(codec, d, nil, block, 1)
		}
	}
	cases := []struct {
		name   string
		policy Policy
		encode func([]float32) (diloco.Encoded, error)
		want   string // the rejection's detail; "" = merged
	}{
		{"the round's top-k", sparse, encode(diloco.Sparse, 64, 8), ""},
		{"fewer values", sparse, encode(diloco.Sparse, 64, 1), ""},
		{"fp32 in a sparse swarm", sparse, encode(diloco.FP32, 0, 0), "the delta is fp32, the experiment's protocol.codec is sparse"},
		{"int8 in a sparse swarm", sparse, encode(diloco.Int8, 16, 0), "the delta is int8"},
		{"another block", sparse, encode(diloco.Sparse, 32, 4), "sparse blocks of 32 values, protocol.sparse_block is 64"},
		{"every value kept", sparse, encode(diloco.Sparse, 64, 64), "64 values kept per block, round 1 keeps at most 8"},
		{"one value over", sparse, encode(diloco.Sparse, 64, 9), "9 values kept per block, round 1 keeps at most 8"},
		{"int8's block", int8s, encode(diloco.Int8, 16, 0), ""},
		{"another int8 block", int8s, encode(diloco.Int8, 8, 0), "int8 blocks of 8 values, protocol.int8_block is 16"},
		{"fp32 in an int8 swarm", int8s, encode(diloco.FP32, 0, 0), "the delta is fp32, the experiment's protocol.codec is int8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.policy)
			honest := f.candidates(t, tc.policy.Codec, map[string][]uint32{"a": {0, 1}, "b": {2, 3}})
			// The odd one's values: an honest window's, so that only its encoding differs.
			res, err := f.trainer(diloco.FP32).Train(context.Background(), f.gen, []uint32{4, 5}, 5, 7)
			require.NoError(t, err)
			raw, err := f.store.ReadAll(res.Delta)
			require.NoError(t, err)
			pid, err := f.gen.ParamsID()
			require.NoError(t, err)
			p, err := pack.Load(f.store.BlobPath(pid))
			require.NoError(t, err)
			n := len(p.Values)
			p.Close()
			fp, err := ParseDelta(raw, f.gen.LayoutHash, n)
			require.NoError(t, err)
			d := make([]float32, fp.N)
			require.NoError(t, diloco.Decode(fp, d, 1))
			enc, err := tc.encode(d)
			require.NoError(t, err)
			id, err := StoreDelta(f.store, enc, f.gen.LayoutHash)
			require.NoError(t, err)
			cands := append(honest, Candidate{Peer: "z-odd", Delta: id, Samples: 10, Microshards: []uint32{4, 5}})
			out, err := (&Merger{Store: f.store, Policy: tc.policy}).Merge(context.Background(), f.genID, f.gen, cands)
			require.NoError(t, err)
			if tc.want == "" {
				require.Empty(t, out.Rejected)
				require.Len(t, out.Head.Contributions, 3)
				return
			}
			require.Len(t, out.Rejected, 1)
			require.Equal(t, "z-odd", out.Rejected[0].Peer)
			require.Equal(t, ReasonWrongCodec, out.Rejected[0].Reason)
			require.Contains(t, out.Rejected[0].Detail, tc.want)
			require.Len(t, out.Head.Contributions, 2)
		})
	}
}

// MaxDeltaBytes holds every update a trainer of the experiment makes, and no fp32 update
// of a lighter codec (at a real model's size): a validator can refuse the latter from its
// manifest.
func TestMaxDeltaBytesBoundsTheEncoding(t *testing.T) {
	for _, codec := range []diloco.Codec{diloco.FP32, diloco.FP16, diloco.Int8, diloco.Sparse} {
		t.Run(string(codec), func(t *testing.T) {
			policy := withCodec(dilocoPolicy, codec)
			f := newFixture(t, policy)
			bound := (&Merger{Store: f.store, Policy: policy}).MaxDeltaBytes(f.gen)
			require.NotZero(t, bound)
			own := f.candidates(t, codec, map[string][]uint32{"a": {0, 1}})[0]
			m, err := f.store.Manifest(own.Delta)
			require.NoError(t, err)
			require.LessOrEqual(t, m.Size, bound, "the experiment's own update")
			// The synthetic model (520 values) is small beside the header's slack; at 1 M
			// values an fp32 update (4 MiB) is above every lighter codec's bound.
			if codec != diloco.FP32 {
				require.Less(t, policy.MaxDeltaBytes(1<<20, 1), uint64(4<<20), "an fp32 update in a %s swarm", codec)
			}
		})
	}
	require.Zero(t, (&Merger{Policy: Policy{Kind: "diloco"}}).MaxDeltaBytes(&chain.Head{}), "no codec, no bound")
}
