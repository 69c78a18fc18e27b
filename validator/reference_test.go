package validator

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/round"
)

func TestReferenceShardsAreTheRoundsOwn(t *testing.T) {
	a := &chain.Head{Round: 4, Params: []byte("params of head 4")}
	b := &chain.Head{Round: 5, Params: []byte("params of head 5")}
	got := ReferenceShards(a, 0, 100, 6)
	require.Equal(t, got, ReferenceShards(a, 0, 100, 6), "every validator draws the same")
	require.NotEqual(t, got, ReferenceShards(b, 0, 100, 6), "each base draws its own")
	require.Len(t, got, 6)
	require.True(t, slices.IsSorted(got))
	require.Len(t, slices.Compact(slices.Clone(got)), 6, "distinct")
	for _, s := range got {
		require.Less(t, s, uint32(100))
	}
	require.Len(t, ReferenceShards(a, 0, 3, 6), 3, "no more than the plan holds")
	require.Empty(t, ReferenceShards(a, 0, 0, 6))
}

// A pass of the round that every trainer failed draws a reference window of its own: a
// round whose first reference every honest window pointed away from must not reject them
// again on every pass (startReference).
func TestEachPassDrawsAReferenceOfItsOwn(t *testing.T) {
	a := &chain.Head{Round: 4, Params: []byte("params of head 4")}
	shards := map[string]bool{}
	seeds := map[int64]bool{}
	for pass := range 8 {
		got := ReferenceShards(a, pass, 1000, 6)
		require.Equal(t, got, ReferenceShards(a, pass, 1000, 6), "every validator draws the same for pass %d", pass)
		shards[fmt.Sprint(got)] = true
		seeds[referenceSeed(7, 4, pass)] = true
	}
	require.Len(t, shards, 8, "each pass draws its own microshards")
	require.Len(t, seeds, 8, "each pass trains with its own seed")
	require.NotEqual(t, referenceSeed(7, 4, 0), referenceSeed(7, 5, 0), "each round its own seed")
}

// flippedFirstPass trains true reference windows, except for each round's first pass,
// whose window it sends reversed: a reference every honest window of the round points
// away from.
type flippedFirstPass struct {
	work       *round.Trainer
	experiment int64
	mu         sync.Mutex
	seeds      []int64
}

func (f *flippedFirstPass) Train(ctx context.Context, base *chain.Head, microshards []uint32, steps int, seed int64) (*round.Result, error) {
	f.mu.Lock()
	f.seeds = append(f.seeds, seed)
	f.mu.Unlock()
	if seed != referenceSeed(f.experiment, base.Round+1, 0) {
		return f.work.Train(ctx, base, microshards, steps, seed)
	}
	w, err := f.work.RunWindow(ctx, base, microshards, steps, seed)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	d, err := w.Delta()
	if err != nil {
		return nil, err
	}
	for i := range d {
		d[i] = -d[i]
	}
	return w.StoreRaw(d)
}

func (f *flippedFirstPass) passes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seeds)
}

// TestANewPassJudgesWithANewReference: a lone trainer, on probation (nothing merged yet),
// sends the same honest window twice in round 1. Against the first pass's reference,
// which points the other way, it is rejected; the pass that readmits it trains a
// reference of its own, and the same window is merged. With one reference per round the
// round would reject it on every pass, for good (CI at stop 50).
func TestANewPassJudgesWithANewReference(t *testing.T) {
	s := newPhaseSwarm(t, 1)
	s.cfg.Merge.Screen.Reference = config.ReferenceOn
	ref := &flippedFirstPass{experiment: s.cfg.Experiment.Seed,
		work: &round.Trainer{Runtime: s.rt, Store: s.store, Shards: dataset.PlanFiles{Plan: s.plan, Shards: s.shards},
			Codec: diloco.FP32, Prefix: "reference-", Fresh: true}}
	s.reference = ref
	s.start(1, "pass validator")
	n := s.nodes[0]
	s.train()
	require.Eventually(t, func() bool {
		return n.sink.snapshot().Rejections[string(merge.ReasonLowCosine)] == 1
	}, 30*time.Second, 10*time.Millisecond, "the window judged against the reversed reference is rejected")
	s.train() // the same window (contribute trains with seed 1), leased again in the next pass
	h := s.canonical(1)
	require.Len(t, h.Contributions, 1)
	require.Equal(t, s.trainer, h.Contributions[0].Peer)
	require.Equal(t, 2, ref.passes(), "one reference window per pass")
}

// TestLostBaseReference: a round screened against a reference names it in its head, and
// the next round compares its reference with it. A lone validator whose store lost the
// tip's reference (nobody else holds it) screens the next round without a reference, as
// when its window fails, instead of failing the round for good.
func TestLostBaseReference(t *testing.T) {
	s := newPhaseSwarm(t, 2)
	s.reference = &round.Trainer{Runtime: s.rt, Store: s.store, Shards: dataset.PlanFiles{Plan: s.plan, Shards: s.shards},
		Codec: diloco.FP32, Prefix: "reference-", Fresh: true}
	s.start(1, "lone validator")
	s.train()
	h1 := s.canonical(1)
	ref, err := h1.ReferenceID()
	require.NoError(t, err)
	require.True(t, ref.Defined(), "round 1 was screened against a reference and names it")
	require.NoError(t, s.store.Remove(ref))
	s.train()
	h2 := s.canonical(2)
	require.Empty(t, h2.Reference, "round 2 is screened without a reference")
	require.Len(t, h2.Contributions, 1)
}
