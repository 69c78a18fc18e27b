package artifact

import (
	"testing"

	"github.com/ipfs/go-cid"
	mh "github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/cids"
)

// Chunk CIDs must be what any multihash implementation computes for the same bytes:
// go-multihash hashes blake3 with a different library than ours.
func TestChunkCIDMatchesGoMultihash(t *testing.T) {
	for _, n := range []int{0, 1, 1023, 1024, 1025, 64 << 10, 1<<20 + 3} {
		b := randomBytes(uint64(n), n)
		want, err := mh.Sum(b, mh.BLAKE3, DigestSize)
		require.NoError(t, err)
		require.Equal(t, cid.NewCidV1(cid.Raw, want), ChunkCID(b), "%d bytes", n)

		// The streaming hasher the fetcher uses agrees, whatever the piece size.
		h := newChunkHasher()
		for _, piece := range []int{1, 7, 4096, hashPiece} {
			h.reset()
			for off := 0; off < n; off += piece {
				h.write(b[off:min(off+piece, n)])
			}
			d, err := ChunkDigest(ChunkCID(b))
			require.NoError(t, err)
			require.Equal(t, d, h.sum(), "%d bytes in pieces of %d", n, piece)
		}
	}
}

func TestCheckChunkCID(t *testing.T) {
	data := []byte("chunk")
	sha, err := mh.Sum(data, mh.SHA2_256, -1)
	require.NoError(t, err)
	short, err := mh.Sum(data, mh.BLAKE3, 16)
	require.NoError(t, err)
	b3, err := mh.Sum(data, mh.BLAKE3, DigestSize)
	require.NoError(t, err)
	cases := []struct {
		name string
		c    cid.Cid
		ok   bool
	}{
		{"blake3 raw", ChunkCID(data), true},
		{"sha2-256 raw (manifest version 1)", cids.Raw(data), false},
		{"CIDv0", cid.NewCidV0(sha), false},
		{"cbor codec", cid.NewCidV1(cids.CodecCBOR, b3), false},
		{"short blake3", cid.NewCidV1(cid.Raw, short), false},
		{"undefined", cid.Undef, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckChunkCID(tc.c)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, cids.ErrBadCID)
			_, err = ChunkDigest(tc.c)
			require.ErrorIs(t, err, cids.ErrBadCID)
			require.ErrorIs(t, VerifyChunk(tc.c, data), cids.ErrBadCID)
		})
	}
}

func TestVerifyChunk(t *testing.T) {
	data := randomBytes(9, 5000)
	c := ChunkCID(data)
	require.NoError(t, VerifyChunk(c, data))
	bad := append([]byte(nil), data...)
	bad[4999] ^= 1
	err := VerifyChunk(c, bad)
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, c.String())
}

// A version 1 manifest (sha2-256 chunks) is refused with an error that says so.
func TestManifestVersionOneRefused(t *testing.T) {
	m := &Manifest{Version: 1, Size: 5, ChunkSize: MinChunkSize, Chunks: []cid.Cid{cids.Raw([]byte("hello"))}}
	_, err := DecodeManifest(m.Encode(), m.ID())
	require.ErrorContains(t, err, "manifest version 1 unsupported (want 2)")

	m.Version = ManifestVersion
	_, err = DecodeManifest(m.Encode(), m.ID())
	require.ErrorIs(t, err, cids.ErrBadCID, "version 2 with a sha2-256 chunk")
	require.ErrorContains(t, err, "manifest chunk 0")
}
