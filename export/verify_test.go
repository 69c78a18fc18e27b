package export

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/pack"
)

// TestTwoNodesExportTheSameBytes: node B holds the head's params because it fetched them
// from node A (verified against the id, as the exchange does); both export the head, with
// different options and histories, and the directories are byte-identical.
func TestTwoNodesExportTheSameBytes(t *testing.T) {
	l := smallLayout()
	a := newStores(t, t.TempDir(), 64<<10)
	id := a.putHead(t, l, values(l, 9), 0, cid.Undef)

	b := newStores(t, t.TempDir(), 64<<10)
	_, h, err := a.heads.Get(id)
	require.NoError(t, err)
	pid, err := h.ParamsID()
	require.NoError(t, err)
	blob, err := a.arts.ReadAll(pid)
	require.NoError(t, err)
	require.NoError(t, b.arts.PutVerified(bytes.NewReader(blob), pid))
	sh, _, err := a.heads.Get(id)
	require.NoError(t, err)
	_, err = b.heads.Put(sh)
	require.NoError(t, err)

	for _, shard := range []int64{0, 64 << 10} {
		da, db := t.TempDir(), t.TempDir()
		srcA, err := OpenHead(a.arts, a.heads, id)
		require.NoError(t, err)
		_, err = Export(ctx, srcA, da, Options{ShardBytes: shard})
		require.NoError(t, err)
		require.NoError(t, srcA.Close())

		// Node B had an older model in its directory and syncs in place.
		_, err = Export(ctx, memSource(t, l, 3, 0), db, Options{ShardBytes: shard})
		require.NoError(t, err)
		srcB, err := OpenHead(b.arts, b.heads, id)
		require.NoError(t, err)
		_, err = Export(ctx, srcB, db, Options{ShardBytes: shard, InPlace: true, BlockBytes: 4096})
		require.NoError(t, err)
		require.NoError(t, srcB.Close())

		require.Equal(t, dirHashes(t, da), dirHashes(t, db), "shard size %d", shard)
	}
}

func TestVerifyHead(t *testing.T) {
	l := smallLayout()
	st := newStores(t, t.TempDir(), 16<<10)
	id := st.putHead(t, l, values(l, 1), 0, cid.Undef)
	hc, err := VerifyHead(st.arts, st.heads, id)
	require.NoError(t, err)
	require.Equal(t, l.Hash(), hc.LayoutHash)
	require.Equal(t, len(l), hc.Tensors)
	require.Greater(t, hc.Chunks, 1)

	// A flipped byte in the stored blob is found and named by chunk.
	path := st.arts.BlobPath(hc.Params)
	require.NoError(t, os.Chmod(path, 0o644))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)-10] ^= 1
	require.NoError(t, os.WriteFile(path, b, 0o644))
	_, err = VerifyHead(st.arts, st.heads, id)
	require.ErrorIs(t, err, artifact.ErrCorrupt)
	require.Contains(t, err.Error(), id.String())
	require.Contains(t, err.Error(), "chunk")

	// A head the store does not hold.
	_, err = VerifyHead(st.arts, st.heads, fakeCID("head", 3))
	require.ErrorIs(t, err, chain.ErrNotFound)

	// A head whose layout hash is not its pack's.
	other := newStores(t, t.TempDir(), 0)
	good := other.putHead(t, l, values(l, 1), 0, cid.Undef)
	_, h, err := other.heads.Get(good)
	require.NoError(t, err)
	h.LayoutHash = smallLayout()[:2].Hash()
	enc, err := h.Encode()
	require.NoError(t, err)
	_, err = other.heads.Put(&chain.SignedHead{Head: enc})
	require.NoError(t, err)
	bad, err := h.ID()
	require.NoError(t, err)
	_, err = VerifyHead(other.arts, other.heads, bad)
	require.ErrorIs(t, err, pack.ErrLayoutMismatch)
	require.Contains(t, err.Error(), h.LayoutHash)
}

func TestVerifyDirFindsEveryDifference(t *testing.T) {
	src := memSource(t, smallLayout(), 1, 1)
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   string
	}{
		{"intact", func(*testing.T, string) {}, ""},
		{"flipped value", func(t *testing.T, dir string) {
			path := filepath.Join(dir, ShardName(2, 3))
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			b[len(b)-1] ^= 0x80
			require.NoError(t, os.WriteFile(path, b, 0o644))
		}, `tensor "encoder.weight": sha256`},
		{"missing index entry", func(t *testing.T, dir string) {
			rewriteIndex(t, dir, func(m map[string]string) { delete(m, "scale") })
		}, `has no entry for tensor "scale"`},
		{"another head's values", func(t *testing.T, dir string) {
			exportOver(t, dir, memSource(t, smallLayout(), 2, 1), 64<<10)
		}, `tensor "decoder.bias": sha256`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			exportOver(t, dir, src, 64<<10)
			tc.damage(t, dir)
			dc, err := VerifyDir(dir, src, nil)
			if tc.want == "" {
				require.NoError(t, err)
				require.Equal(t, len(src.Layout), dc.Tensors)
				require.Len(t, dc.Files, 3)
				return
			}
			require.ErrorIs(t, err, ErrMismatch)
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), dir)
		})
	}
	// The same values under another head's metadata: equal values, with a note.
	dir := t.TempDir()
	exportOver(t, dir, withRound(src, 5), 0)
	dc, err := VerifyDir(dir, src, nil)
	require.NoError(t, err)
	require.Len(t, dc.Notes, 1)
	require.Contains(t, dc.Notes[0], "round 5")
}
