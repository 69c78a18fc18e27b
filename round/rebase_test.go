package round

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/pack"
)

// A window trained ahead is reconciled with the head it is measured against: the trainer
// goes on from its eager guess at the next head, value by value in float32, over several
// stream blocks and tensors: the head plus the window's progress, or, with the head's
// parent and n updates merged, the head plus 1/n of the progress and (n−1)/n of the head's
// own step. A pack of another layout is refused.
func TestRebaseAddsTheWindowsProgressToTheHead(t *testing.T) {
	n := 2*StreamBlock + 77
	layout := pack.Layout{{Name: "a", Shape: []int64{int64(n - 5)}}, {Name: "b", Shape: []int64{5}}}
	rng := rand.New(rand.NewPCG(3, 4))
	head, start, local, parent := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range head {
		head[i] = float32(rng.NormFloat64())
		parent[i] = head[i] + float32(0.05*rng.NormFloat64())
		start[i] = head[i] + float32(0.1*rng.NormFloat64())
		local[i] = start[i] + float32(0.01*rng.NormFloat64())
	}
	dir := t.TempDir()
	write := func(name string, l pack.Layout, v []float32) string {
		p, err := pack.New(l, v, nil)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, p.WriteFile(path))
		return path
	}
	headPath, startPath, localPath := write("head", layout, head), write("start", layout, start), write("local", layout, local)
	parentPath := write("parent", layout, parent)
	for _, tc := range []struct {
		name   string
		parent string
		n      int
		want   func(i int) float32
		exact  bool // the eager guess is the trainer's own: a fused multiply-add may round it otherwise
	}{
		{"whole progress", "", 1, func(i int) float32 { return head[i] + (local[i] - start[i]) }, true},
		{"no parent", "", 3, func(i int) float32 { return head[i] + (local[i] - start[i]) }, true},
		{"eager share of 3", parentPath, 3, func(i int) float32 {
			own, others := float32(1)/3, float32(2)/3
			return head[i] + (own*(local[i]-start[i]) + others*(head[i]-parent[i]))
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out-"+tc.name)
			require.NoError(t, rebase(headPath, startPath, localPath, tc.parent, tc.n, out))
			got, err := pack.Load(out)
			require.NoError(t, err)
			defer got.Close()
			require.NoError(t, got.CheckLayout(layout))
			for i := range head {
				if tc.exact {
					require.Equal(t, tc.want(i), got.Values[i], "value %d", i)
				} else {
					require.InDelta(t, tc.want(i), got.Values[i], 1e-6, "value %d", i)
				}
			}
		})
	}

	other := write("other", pack.Layout{{Name: "a", Shape: []int64{int64(n)}}}, local)
	require.ErrorIs(t, rebase(headPath, startPath, other, "", 1, filepath.Join(dir, "bad")), pack.ErrLayoutMismatch)
	require.ErrorIs(t, rebase(headPath, startPath, localPath, other, 3, filepath.Join(dir, "bad")), pack.ErrLayoutMismatch)
}
