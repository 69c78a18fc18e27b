package round

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/pack"
)

// A window trained ahead is reconciled with the head it is measured against: the trainer
// goes on from the head plus the window's progress, value by value in float32, over
// several stream blocks and tensors; a pack of another layout is refused.
func TestRebaseAddsTheWindowsProgressToTheHead(t *testing.T) {
	n := 2*StreamBlock + 77
	layout := pack.Layout{{Name: "a", Shape: []int64{int64(n - 5)}}, {Name: "b", Shape: []int64{5}}}
	rng := rand.New(rand.NewPCG(3, 4))
	head, start, local := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range head {
		head[i] = float32(rng.NormFloat64())
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
	out := filepath.Join(dir, "out")
	require.NoError(t, rebase(headPath, startPath, localPath, out))
	got, err := pack.Load(out)
	require.NoError(t, err)
	defer got.Close()
	require.NoError(t, got.CheckLayout(layout))
	for i := range head {
		want := head[i] + (local[i] - start[i])
		require.Equal(t, want, got.Values[i], "value %d", i)
	}

	other := write("other", pack.Layout{{Name: "a", Shape: []int64{int64(n)}}}, local)
	require.ErrorIs(t, rebase(headPath, startPath, other, filepath.Join(dir, "bad")), pack.ErrLayoutMismatch)
}
