package artifact

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/cids"
)

func TestStorePutOpenVerify(t *testing.T) {
	s, err := OpenStore(t.TempDir(), Options{ChunkSize: 1024})
	require.NoError(t, err)
	cases := map[string][]byte{
		"empty":            {},
		"one byte":         {7},
		"one chunk":        randomBytes(1, 1024),
		"chunks and a bit": randomBytes(2, 5*1024+17),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			id, err := s.PutBytes(data)
			require.NoError(t, err)
			require.NoError(t, cids.Check(id, cids.CodecCBOR))
			require.True(t, s.Has(id))
			again, err := s.PutBytes(data)
			require.NoError(t, err)
			require.True(t, id.Equals(again), "same bytes, same id")

			m, err := s.Manifest(id)
			require.NoError(t, err)
			require.Equal(t, uint64(len(data)), m.Size)
			b, err := s.Open(id)
			require.NoError(t, err)
			require.True(t, bytes.Equal(data, b.Bytes()))
			require.NoError(t, b.Close())
			require.NoError(t, s.Verify(id))

			st, err := os.Stat(s.BlobPath(id))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o444), st.Mode().Perm(), "blobs are read-only")
		})
	}
	ids, err := s.List()
	require.NoError(t, err)
	require.Len(t, ids, len(cases))
}

func TestVerifyCatchesCorruption(t *testing.T) {
	s, err := OpenStore(t.TempDir(), Options{ChunkSize: 1024})
	require.NoError(t, err)
	data := randomBytes(3, 4096)
	id, err := s.PutBytes(data)
	require.NoError(t, err)
	path := s.BlobPath(id)
	require.NoError(t, os.Chmod(path, 0o644))
	data[2000] ^= 0xff
	require.NoError(t, os.WriteFile(path, data, 0o644))
	err = s.Verify(id)
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, "chunk 1")

	require.NoError(t, os.WriteFile(path, data[:100], 0o644))
	_, err = s.Open(id)
	require.ErrorIs(t, err, ErrCorrupt)

	require.NoError(t, s.Remove(id))
	require.False(t, s.Has(id))
	_, err = s.Open(id)
	require.ErrorIs(t, err, ErrNotFound)
}

func TestAbortLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenStore(dir, Options{})
	require.NoError(t, err)
	w, err := s.Create()
	require.NoError(t, err)
	_, _ = w.Write([]byte("half"))
	w.Abort()
	ents, _ := os.ReadDir(dir + "/tmp")
	require.Empty(t, ents)
	ids, _ := s.List()
	require.Empty(t, ids)
}

func TestOpenStoreRejectsBadChunkSize(t *testing.T) {
	_, err := OpenStore(t.TempDir(), Options{ChunkSize: 10})
	require.ErrorContains(t, err, "chunk size")
}

func TestParseAcceptsOnlyArtifactIDs(t *testing.T) {
	m := &Manifest{Version: ManifestVersion, Size: 0, ChunkSize: 1024}
	_, err := cids.Parse(m.ID().String())
	require.NoError(t, err)
	_, err = cids.Parse(cids.Raw([]byte("x")).String())
	require.ErrorIs(t, err, cids.ErrBadCID)
	_, err = cids.Parse("not a cid")
	require.Error(t, err)
}

func FuzzDecodeManifest(f *testing.F) {
	m := &Manifest{Version: ManifestVersion, Size: 3000, ChunkSize: 1024, Chunks: []cid.Cid{ChunkCID([]byte("a")), ChunkCID([]byte("b")), ChunkCID([]byte("c"))}}
	f.Add(m.Encode())
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b, cid.Undef)
		if err != nil {
			return
		}
		again, err := DecodeManifest(m.Encode(), m.ID())
		require.NoError(t, err)
		require.Equal(t, m.Size, again.Size)
	})
}

// Temporary files of writes that a killed process never finished are removed when the
// store opens again; committed artifacts and the state of partial downloads stay. A store
// opened with LeaveTemps (a command beside a running node) removes nothing: the files may
// be that node's writes in progress.
func TestOpenStoreRemovesTempFilesOfKilledWrites(t *testing.T) {
	for _, leave := range []bool{false, true} {
		t.Run(fmt.Sprintf("LeaveTemps=%v", leave), func(t *testing.T) {
			dir := t.TempDir()
			st, err := OpenStore(dir, Options{ChunkSize: testChunk})
			require.NoError(t, err)
			id, err := st.PutBytes(randomBytes(51, 3*testChunk))
			require.NoError(t, err)
			keep := []string{"partial/" + id.String() + ".manifest", "partial/" + id.String() + ".data", "partial/" + id.String() + ".have"}
			leaks := []string{"tmp/new-123", "manifests/." + id.String() + ".tmp4567", "partial/." + id.String() + ".manifest.tmp89"}
			for _, f := range append(keep, leaks...) {
				require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644))
			}

			st, err = OpenStore(dir, Options{ChunkSize: testChunk, LeaveTemps: leave})
			require.NoError(t, err)
			for _, f := range leaks {
				if leave {
					require.FileExists(t, filepath.Join(dir, f))
				} else {
					require.NoFileExists(t, filepath.Join(dir, f))
				}
			}
			for _, f := range keep {
				require.FileExists(t, filepath.Join(dir, f))
			}
			require.True(t, st.Has(id))
			require.NoError(t, st.Verify(id))
		})
	}
}
