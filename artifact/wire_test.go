package artifact

import (
	"bufio"
	"bytes"
	"errors"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/cids"
)

func testID() cid.Cid {
	return (&Manifest{Version: ManifestVersion, Size: 3, ChunkSize: MinChunkSize, Chunks: []cid.Cid{ChunkCID([]byte("abc"))}}).ID()
}

func TestRequestRoundTrip(t *testing.T) {
	id := testID()
	many := make([]int, MaxChunksPerRequest)
	for i := range many {
		many[i] = i * 997
	}
	tests := []struct {
		name string
		req  request
	}{
		{"manifest", request{kind: reqManifest, id: id}},
		{"one chunk", request{kind: reqChunks, id: id, indices: []int{0}}},
		{"chunks out of order", request{kind: reqChunks, id: id, indices: []int{9, 3, 300000}}},
		{"largest request", request{kind: reqChunks, id: id, indices: many}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			frame := appendRequest(nil, tt.req)
			payload, err := readFrame(bufio.NewReader(bytes.NewReader(frame)), make([]byte, maxRequestFrame), maxRequestFrame)
			require.NoError(t, err)
			got, err := decodeRequest(payload, nil)
			require.NoError(t, err)
			require.Equal(t, tt.req.kind, got.kind)
			require.True(t, tt.req.id.Equals(got.id))
			require.Equal(t, len(tt.req.indices), len(got.indices))
			require.Equal(t, tt.req.indices, append([]int(nil), got.indices...)[:len(tt.req.indices)])
		})
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	idb := testID().Bytes()
	withID := func(prefix []byte, rest ...byte) []byte {
		p := append(append([]byte{}, prefix...), byte(len(idb)))
		return append(append(p, idb...), rest...)
	}
	tests := []struct {
		name string
		b    []byte
		code int
	}{
		{"empty", nil, codeMalformed},
		{"version only", []byte{wireVersion}, codeMalformed},
		{"future version", []byte{2, reqManifest}, codeVersion},
		{"response kind as request", []byte{wireVersion, respChunk}, codeUnknownKind},
		{"id length beyond frame", []byte{wireVersion, reqManifest, 40, 1, 2}, codeMalformed},
		{"zero id length", []byte{wireVersion, reqManifest, 0}, codeMalformed},
		{"non-minimal varint", withID([]byte{wireVersion, reqChunks}, 0x81, 0x00, 1), codeMalformed},
		{"raw CID", append([]byte{wireVersion, reqManifest, byte(len(cids.Raw(nil).Bytes()))}, cids.Raw(nil).Bytes()...), codeMalformed},
		{"manifest with trailing bytes", withID([]byte{wireVersion, reqManifest}, 1), codeMalformed},
		{"count larger than frame", withID([]byte{wireVersion, reqChunks}, 5, 1, 2), codeMalformed},
		{"count above limit", withID([]byte{wireVersion, reqChunks}, 0x81, 0x40), codeMalformed},
		{"chunks with trailing bytes", withID([]byte{wireVersion, reqChunks}, 1, 1, 7), codeMalformed},
		{"index beyond 2^31", withID([]byte{wireVersion, reqChunks}, 1, 0x80, 0x80, 0x80, 0x80, 0x08), codeMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeRequest(tt.b, nil)
			var we *wireError
			require.True(t, errors.As(err, &we), "err = %v", err)
			require.Equal(t, tt.code, we.code, we.msg)
		})
	}
}

func TestChunkHeaderMatchesReader(t *testing.T) {
	for _, tc := range []struct{ index, n int }{{0, 0}, {1, 1}, {127, 1024}, {128, 1 << 20}, {maxIndex, MaxChunkSize}} {
		var hdr [maxChunkHeader]byte
		start := putChunkHeader(hdr[:], tc.index, tc.n)
		frame := append(append([]byte{}, hdr[start:]...), make([]byte, tc.n)...)
		resp, err := readResponse(bufio.NewReader(bytes.NewReader(frame)), MaxChunkSize+maxChunkHeader)
		require.NoError(t, err)
		require.Equal(t, respChunk, resp.kind)
		require.Equal(t, tc.index, resp.index)
		require.Equal(t, tc.n, resp.dataLen)
	}
}

func TestErrorFrameTruncatesLongMessages(t *testing.T) {
	long := bytes.Repeat([]byte("é"), maxErrorMessage) // two bytes a rune
	frame := appendErrorFrame(nil, codeInternal, string(long))
	resp, err := readResponse(bufio.NewReader(bytes.NewReader(frame)), 1<<20)
	require.NoError(t, err)
	require.Equal(t, codeInternal, resp.code)
	require.LessOrEqual(t, len(resp.msg), maxErrorMessage)
	require.NotContains(t, resp.msg, "\\x", "cut on a rune boundary")
}

// The request decoder reads bytes from any peer: it must never panic, accept only
// canonical encodings (so a decoded request re-encodes to the same bytes), and respect
// its limits.
func FuzzDecodeRequest(f *testing.F) {
	id := testID()
	for _, r := range []request{
		{kind: reqManifest, id: id},
		{kind: reqChunks, id: id, indices: []int{0, 1, 2, 1000}},
	} {
		frame := appendRequest(nil, r)
		f.Add(frame[1:]) // payload without the one-byte length prefix
	}
	f.Add([]byte{wireVersion, reqChunks, 0})
	f.Add([]byte{9, 9, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b, nil)
		if err != nil {
			var we *wireError
			if !errors.As(err, &we) || we.code == 0 || we.msg == "" {
				t.Fatalf("error %v is not a wire error with a code", err)
			}
			return
		}
		if len(r.indices) > MaxChunksPerRequest {
			t.Fatalf("%d indices accepted", len(r.indices))
		}
		frame := appendRequest(nil, r)
		payload, err := readFrame(bufio.NewReader(bytes.NewReader(frame)), make([]byte, maxRequestFrame), maxRequestFrame)
		if err != nil {
			t.Fatalf("re-encoded request does not read back: %v", err)
		}
		if !bytes.Equal(payload, b) {
			t.Fatalf("non-canonical request accepted: % x re-encodes to % x", b, payload)
		}
	})
}

// The response reader parses frames from holders: no panics, limits respected.
func FuzzReadResponse(f *testing.F) {
	var hdr [maxChunkHeader]byte
	start := putChunkHeader(hdr[:], 5, 3)
	f.Add(append(append([]byte{}, hdr[start:]...), 1, 2, 3))
	f.Add(appendErrorFrame(nil, codeBadIndex, "chunk 9 out of range"))
	f.Add(appendSmallFrame(nil, respMissing, 7, true))
	f.Add(appendSmallFrame(nil, respNotFound, 0, false))
	f.Fuzz(func(t *testing.T, b []byte) {
		const limit = 4096
		resp, err := readResponse(bufio.NewReader(bytes.NewReader(b)), limit)
		if err != nil {
			return
		}
		if resp.dataLen < 0 || resp.dataLen > limit || resp.index < 0 || resp.index > maxIndex {
			t.Fatalf("out-of-range response accepted: %+v", resp)
		}
		if len(resp.msg) > maxErrorMessage*4 {
			t.Fatalf("error message of %d bytes", len(resp.msg))
		}
	})
}
