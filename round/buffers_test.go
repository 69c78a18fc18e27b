package round

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
)

// TestBatchNormBuffersThroughRounds: a running variance (a buffer named in the pack's
// metadata) follows the trainers' average through diloco rounds and stays positive, with
// no momentum, while the weights take the outer step; the same rounds without the
// metadata step the variance with Nesterov momentum and drive it below zero.
func TestBatchNormBuffersThroughRounds(t *testing.T) {
	const rounds = 6
	run := func(meta map[string]string) (vars [][]float32, avgs [][]float64, weight []float32, mom []float32) {
		store, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
		require.NoError(t, err)
		layout := pack.Layout{{Name: "bn.running_var", Shape: []int64{4}}, {Name: "w", Shape: []int64{6}}}
		vals := []float32{1, 1, 1, 1, 0, 0, 0, 0, 0, 0}
		p, err := pack.New(layout, vals, meta)
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "init.safetensors")
		require.NoError(t, p.WriteFile(path))
		// Not the defaults: at lr 1.0 / Nesterov 0.5 this toy's weights land exactly on the
		// trainers' average in round 2 and stay there, so "stepped, not averaged" could not be
		// told apart.
		outer := diloco.OuterConfig{LR: 0.7, Momentum: 0.9, Nesterov: true}
		policy := Policy{Kind: "diloco", Outer: outer, Aggregator: merge.AggMean, Codec: diloco.FP32,
			Screen: merge.ScreenConfig{MaxNormRatio: 10}}
		base, baseID, err := Genesis(store, path, "net", "exp", "plan", 64, policy)
		require.NoError(t, err)
		m := &Merger{Store: store, Policy: policy}
		cur := vals
		for r := range rounds {
			// Two trainers: their running variances move toward 0.2 and 0.3 (positive), their
			// weights toward 1.
			locals := [][]float32{{0.2, 0.2, 0.2, 0.2, 1, 1, 1, 1, 1, 1}, {0.3, 0.3, 0.3, 0.3, 1, 1, 1, 1, 1, 1}}
			samples := []uint64{10, 30}
			var cands []Candidate
			avg := make([]float64, 4)
			for k, local := range locals {
				d := make([]float32, len(cur))
				for i := range d {
					d[i] = cur[i] - local[i]
				}
				enc, err := diloco.Encode(diloco.FP32, d, nil, 0, 1)
				require.NoError(t, err)
				id, err := StoreDelta(store, enc, base.LayoutHash)
				require.NoError(t, err)
				cands = append(cands, Candidate{Peer: string(rune('a' + k)), Delta: id, Samples: samples[k], Microshards: []uint32{uint32(2*r + k)}})
				for i := range avg {
					avg[i] += float64(local[i]) * float64(samples[k]) / 40
				}
			}
			out, err := m.Merge(context.Background(), baseID, base, cands)
			require.NoError(t, err)
			base, baseID = out.Head, out.ID
			cur = headValues(t, store, base.Params)
			vars = append(vars, cur[:4])
			avgs = append(avgs, avg)
			weight = cur[4:]
			mom = headValues(t, store, base.OuterState)
		}
		return
	}

	vars, avgs, weight, mom := run(map[string]string{BuffersMeta: "bn.running_var"})
	for r := range vars {
		for i, v := range vars[r] {
			require.InDelta(t, avgs[r][i], v, 1e-6, "round %d: the running variance is the trainers' weighted average", r+1)
			require.Greater(t, v, float32(0))
		}
	}
	require.Equal(t, []float32{0, 0, 0, 0}, mom[:4], "buffers carry no momentum")
	require.NotEqual(t, float32(1), weight[0], "weights take the outer step, not the average")
	require.NotZero(t, mom[4], "weights keep their momentum")

	stepped, _, _, _ := run(nil)
	lowest := float32(math.Inf(1))
	for _, v := range stepped {
		lowest = min(lowest, v[0])
	}
	require.Less(t, lowest, float32(0), "without the buffers metadata the outer step drives the running variance negative")
}

func headValues(t *testing.T, store *artifact.Store, id []byte) []float32 {
	t.Helper()
	c, err := cid.Cast(id)
	require.NoError(t, err)
	p, err := pack.Load(store.BlobPath(c))
	require.NoError(t, err)
	defer p.Close()
	return append([]float32(nil), p.Values...)
}
