package round

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/merge"
)

// TestMergeWithReferenceJudgesHalfACohort: two honest updates and two sign flips of them,
// merged against a reference update trained on other data of the same base: the flips
// are rejected and the honest ones merged, the same head on every validator whatever its
// worker count; against the cohort alone a pair of flips beside a pair of honest
// updates leaves nothing to tell them apart.
func TestMergeWithReferenceJudgesHalfACohort(t *testing.T) {
	policy := dilocoPolicy
	policy.Screen = merge.ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	f := newFixture(t, policy)
	ctx := context.Background()
	cands := f.candidates(t, diloco.FP32, map[string][]uint32{"a": {0, 1}, "b": {2, 3}})
	for p, ms := range map[string][]uint32{"c": {0, 1}, "d": {2, 3}} {
		// The honest windows' sign flips (the same data, so the cohort's pairs cancel).
		w, err := f.trainer(diloco.FP32).RunWindow(ctx, f.gen, ms, 5, 7)
		require.NoError(t, err)
		d, err := w.Delta()
		require.NoError(t, err)
		for i := range d {
			d[i] = -d[i]
		}
		res, err := w.StoreRaw(d)
		w.Close()
		require.NoError(t, err)
		cands = append(cands, Candidate{Peer: p, Delta: res.Delta, Samples: res.Samples, Microshards: ms, Loss: res.Loss})
	}
	refTrainer := &Trainer{Runtime: f.rt, Store: f.store, Shards: f.shards, Codec: diloco.FP32, Prefix: "reference-", Fresh: true}
	ref, err := refTrainer.Train(ctx, f.gen, []uint32{6, 7}, 5, 11)
	require.NoError(t, err)
	again, err := refTrainer.Train(ctx, f.gen, []uint32{6, 7}, 5, 11)
	require.NoError(t, err)
	require.True(t, ref.Delta.Equals(again.Delta), "a fresh reference window depends only on its base, data and seed")
	require.Empty(t, refTrainer.OptState, "a fresh trainer keeps no optimizer state")

	m1 := &Merger{Store: f.store, Policy: policy, Workers: 1}
	m3 := &Merger{Store: f.store, Policy: policy, Workers: 3}
	o1, err := m1.MergeWith(ctx, f.genID, f.gen, cands, ref.Delta)
	require.NoError(t, err)
	o3, err := m3.MergeWith(ctx, f.genID, f.gen, cands, ref.Delta)
	require.NoError(t, err)
	require.True(t, o1.ID.Equals(o3.ID), "followers recompute the verdicts against the reference bit for bit")
	var merged []string
	for _, c := range o1.Head.Contributions {
		merged = append(merged, c.Peer)
	}
	require.Equal(t, []string{"a", "b"}, merged)
	require.Len(t, o1.Rejected, 2)
	for _, r := range o1.Rejected {
		require.Equal(t, string(merge.ReasonLowCosine), r.Reason, r.Peer)
		require.Contains(t, r.Detail, "cosine to reference")
	}
}

// TestHeadNamesItsReference: a round merged against a reference names it in its head; the
// next round's merge reads it beside its own reference and carries their cosine in the
// screening history (merge.History.Self), the same on every worker count; a base whose
// reference is not in the store cannot be merged against a reference, and the error names
// it.
func TestHeadNamesItsReference(t *testing.T) {
	policy := dilocoPolicy
	policy.Screen = merge.ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}
	f := newFixture(t, policy)
	ctx := context.Background()
	refTrainer := &Trainer{Runtime: f.rt, Store: f.store, Shards: f.shards, Codec: diloco.FP32, Prefix: "reference-", Fresh: true}
	m := &Merger{Store: f.store, Policy: policy, Workers: 1}

	plain, err := m.Merge(ctx, f.genID, f.gen, f.candidates(t, diloco.FP32, map[string][]uint32{"a": {0, 1}, "b": {2, 3}}))
	require.NoError(t, err)
	require.Empty(t, plain.Head.Reference, "a round merged without a reference names none")

	ref1, err := refTrainer.Train(ctx, f.gen, []uint32{6, 7}, 5, 11)
	require.NoError(t, err)
	o1, err := m.MergeWith(ctx, f.genID, f.gen, f.candidates(t, diloco.FP32, map[string][]uint32{"a": {0, 1}, "b": {2, 3}}), ref1.Delta)
	require.NoError(t, err)
	named, err := o1.Head.ReferenceID()
	require.NoError(t, err)
	require.True(t, named.Equals(ref1.Delta), "the head names the reference that judged it")
	require.Zero(t, o1.Head.Metrics.Screen.SelfN, "genesis has no reference to compare with")

	var cands []Candidate
	for p, ms := range map[string][]uint32{"a": {4, 5}, "b": {6, 7}} {
		res, err := f.trainer(diloco.FP32).Train(ctx, o1.Head, ms, 5, 8)
		require.NoError(t, err)
		cands = append(cands, Candidate{Peer: p, Delta: res.Delta, Samples: res.Samples, Microshards: ms, Loss: res.Loss})
	}
	ref2, err := refTrainer.Train(ctx, o1.Head, []uint32{0, 1}, 5, 12)
	require.NoError(t, err)
	o2, err := m.MergeWith(ctx, o1.ID, o1.Head, cands, ref2.Delta)
	require.NoError(t, err)
	require.Equal(t, uint64(1), o2.Head.Metrics.Screen.SelfN, "the references' cosine is folded in")
	require.Contains(t, o2.Screened, "reference to the base's")
	o2w, err := (&Merger{Store: f.store, Policy: policy, Workers: 3}).MergeWith(ctx, o1.ID, o1.Head, cands, ref2.Delta)
	require.NoError(t, err)
	require.True(t, o2.ID.Equals(o2w.ID), "followers recompute it bit for bit")

	require.NoError(t, f.store.Remove(ref1.Delta))
	_, err = m.MergeWith(ctx, o1.ID, o1.Head, cands, ref2.Delta)
	require.ErrorContains(t, err, "the base's reference update "+ref1.Delta.String())
}
