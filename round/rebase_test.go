package round

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/pack"
	"github.com/p2pnode/p2pnode/pyruntime"
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

// A window trained ahead that is moved onto its head (MoveAhead) goes on from the head with
// its progress kept, and its update is measured from the head: moved before its first step
// it trains as a window started from the head does. A request that comes after its last
// step is not applied (the update is measured from its start) and Close removes it.
func TestMoveAheadMovesTheWindowOntoItsHead(t *testing.T) {
	f := newFixture(t, dilocoPolicy)
	ctx := context.Background()
	ms := []uint32{0, 1}
	ref, err := f.trainer(diloco.FP32).RunWindow(ctx, f.gen, ms, 5, 7)
	require.NoError(t, err)
	defer ref.Close()
	want, err := ref.Delta()
	require.NoError(t, err)

	genID, err := f.gen.ParamsID()
	require.NoError(t, err)
	guess := func(t *testing.T) string {
		p, err := pack.Load(f.store.BlobPath(genID))
		require.NoError(t, err)
		defer p.Close()
		v := slices.Clone(p.Values)
		for i := range v {
			v[i] += 0.05 * float32(i%7-3)
		}
		g, err := pack.New(p.Layout, v, nil)
		require.NoError(t, err)
		path := filepath.Join(f.rt.ScratchDir(), "guess.safetensors")
		require.NoError(t, g.WriteFile(path))
		return path
	}
	leftovers := func(t *testing.T) []string {
		m, err := filepath.Glob(filepath.Join(f.rt.ScratchDir(), "ahead-shift-*"))
		require.NoError(t, err)
		return m
	}

	t.Run("before its first step", func(t *testing.T) {
		tr := f.trainer(diloco.FP32)
		f.rt.Hook = func(job pyruntime.TrainJob) error {
			require.NotEmpty(t, job.Shift)
			return tr.MoveAhead(1, f.gen)
		}
		defer func() { f.rt.Hook = nil }()
		start := guess(t)
		w, err := tr.RunWindowFrom(ctx, start, 1, ms, 5, 7)
		require.NoError(t, err)
		require.Equal(t, 0, w.MovedAt())
		got, err := w.Delta()
		require.NoError(t, err)
		require.InDeltaSlice(t, want, got, 1e-5, "the update is the window's progress from the head")
		w.Close()
		require.NoFileExists(t, start)
		require.Empty(t, leftovers(t))
	})

	t.Run("after its last step", func(t *testing.T) {
		tr := f.trainer(diloco.FP32)
		start := guess(t)
		w, err := tr.RunWindowFrom(ctx, start, 1, ms, 5, 7)
		require.NoError(t, err)
		require.NoError(t, tr.MoveAhead(1, f.gen))
		require.Equal(t, -1, w.MovedAt())
		got, err := w.Delta()
		require.NoError(t, err)
		s, err := pack.Load(start)
		require.NoError(t, err)
		defer s.Close()
		o, err := pack.Load(w.out)
		require.NoError(t, err)
		defer o.Close()
		for i := range got {
			require.Equal(t, s.Values[i]-o.Values[i], got[i], "value %d: measured from the window's start", i)
		}
		w.Close()
		require.Empty(t, leftovers(t))
	})

	t.Run("a head not in the store", func(t *testing.T) {
		h := *f.gen
		h.Params = []byte("not a cid")
		require.Error(t, f.trainer(diloco.FP32).MoveAhead(1, &h))
		h.Params = cids.Raw([]byte("not stored")).Bytes()
		require.ErrorIs(t, f.trainer(diloco.FP32).MoveAhead(1, &h), artifact.ErrNotFound)
	})
}
