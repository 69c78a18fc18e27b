package round

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
)

// TestStreamingEncodeMatchesStoreDelta: the trainer's block-by-block encode stores the
// artifact StoreDelta stores for the whole-vector Encode, leaves the same residual and
// reports merge.Norm of the delta, for every dense codec and odd int8 blocks.
func TestStreamingEncodeMatchesStoreDelta(t *testing.T) {
	n := StreamBlock + 4321
	layout := pack.Layout{{Name: "a", Shape: []int64{int64(n - 10)}}, {Name: "b", Shape: []int64{10}}}
	rng := rand.New(rand.NewPCG(8, 8))
	base, local := make([]float32, n), make([]float32, n)
	for i := range base {
		base[i] = float32(rng.NormFloat64())
		local[i] = base[i] + float32(0.01*rng.NormFloat64())
	}
	dir := t.TempDir()
	write := func(name string, v []float32) string {
		p, err := pack.New(layout, v, nil)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, p.WriteFile(path))
		return path
	}
	basePath, localPath := write("base.safetensors", base), write("local.safetensors", local)
	for _, tc := range []struct {
		codec diloco.Codec
		block int
	}{{diloco.FP32, 0}, {diloco.FP16, 0}, {diloco.Int8, 0}, {diloco.Int8, 100}, {diloco.Int8, 1 << 19}} {
		t.Run(string(tc.codec), func(t *testing.T) {
			store, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
			require.NoError(t, err)
			res0 := make([]float32, n)
			for i := range res0 {
				res0[i] = float32(0.001 * rng.NormFloat64())
			}
			delta := make([]float32, n)
			require.NoError(t, diloco.PseudoGradient(delta, base, local, 1))
			wantRes := slices.Clone(res0)
			enc, err := diloco.Encode(tc.codec, delta, wantRes, tc.block, 1)
			require.NoError(t, err)
			want, err := StoreDelta(store, enc, layout.Hash())
			require.NoError(t, err)

			baseR, err := pack.OpenPackReader(basePath)
			require.NoError(t, err)
			defer baseR.Close()
			localR, err := pack.OpenPackReader(localPath)
			require.NoError(t, err)
			defer localR.Close()
			gotRes := slices.Clone(res0)
			got, norm, err := encodeStreaming(store, baseR, localR, tc.codec, tc.block, gotRes, 2)
			require.NoError(t, err)
			require.True(t, want.Equals(got), "streamed %s, whole %s", got, want)
			for i := range wantRes {
				if math.Float32bits(wantRes[i]) != math.Float32bits(gotRes[i]) {
					t.Fatalf("residual %d: %v, whole-vector %v", i, gotRes[i], wantRes[i])
				}
			}
			require.Equal(t, merge.Norm(delta, 1), norm)
		})
	}
}

// TestStreamingEncodeRefusesNonFiniteOutput names the tensor holding the NaN.
func TestStreamingEncodeRefusesNonFiniteOutput(t *testing.T) {
	layout := pack.Layout{{Name: "a", Shape: []int64{5}}, {Name: "b", Shape: []int64{3}}}
	dir := t.TempDir()
	mk := func(name string, v []float32) *pack.PackReader {
		p, err := pack.New(layout, v, nil)
		require.NoError(t, err)
		path := filepath.Join(dir, name)
		require.NoError(t, p.WriteFile(path))
		r, err := pack.OpenPackReader(path)
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		return r
	}
	baseR := mk("base", make([]float32, 8))
	localR := mk("local", []float32{0, 0, 0, 0, 0, 0, float32(math.NaN()), 0})
	store, err := artifact.OpenStore(t.TempDir(), artifact.Options{})
	require.NoError(t, err)
	_, _, err = encodeStreaming(store, baseR, localR, diloco.Int8, 0, nil, 1)
	require.ErrorIs(t, err, ErrNonFinite)
	require.ErrorContains(t, err, `"b"`)
}
