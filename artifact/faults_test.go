package artifact

import (
	"bufio"
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/network"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	mh "github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/cids"
)

// fakeHolder replaces a node's handler with answer, called for every request a fetcher
// sends; it writes whatever frames it likes. Returning false ends the stream (reset).
func fakeHolder(t *testing.T, n *testNode, answer func(s network.Stream, r request) bool) *atomic.Int32 {
	t.Helper()
	var streams atomic.Int32
	n.x.Close()
	n.h.SetStreamHandler(ProtocolID, func(s network.Stream) {
		streams.Add(1)
		br := bufio.NewReader(s)
		buf := make([]byte, maxRequestFrame)
		for {
			payload, err := readFrame(br, buf, maxRequestFrame)
			if err != nil {
				s.Reset()
				return
			}
			r, err := decodeRequest(payload, nil)
			if err != nil || !answer(s, r) {
				s.Reset()
				return
			}
		}
	})
	return &streams
}

// writeChunkFrame writes a chunk frame the way an honest holder would.
func writeChunkFrame(s network.Stream, index int, data []byte) error {
	buf := make([]byte, maxChunkHeader+len(data))
	copy(buf[maxChunkHeader:], data)
	start := putChunkHeader(buf[:maxChunkHeader], index, len(data))
	_, err := s.Write(buf[start:])
	return err
}

// A holder serving corrupt chunks is caught at its first bad chunk and penalised; the
// artifact completes from the others and the bad bytes never reach the store.
func TestFetchCorruptHolder(t *testing.T) {
	c := newCluster(t, 4, mocknet.LinkOptions{}, ExchangeOptions{Window: 2, StreamsPerPeer: 1})
	fetcher, bad, good1, good2 := c.nodes[0], c.nodes[1], c.nodes[2], c.nodes[3]
	data := randomBytes(20, 64*testChunk)
	id := seed(t, data, bad, good1, good2)
	corruptBlob(t, bad, id)

	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id, bad.id(), good1.id(), good2.id()))
	requireStored(t, fetcher, id, data)
	require.Equal(t, 1.0, fetcher.metric(t, "p2ptrain_artifact_peer_drops_total", "outcome", peerBadChunk))
	badChunks := fetcher.metric(t, "p2ptrain_artifact_bad_chunks_total")
	require.GreaterOrEqual(t, badChunks, 1.0)
	// One stream with a window of 2: the holder gets at most a few requests in before
	// its first chunk is checked.
	require.LessOrEqual(t, bad.metric(t, "p2ptrain_artifact_sent_bytes_total"), float64(4*testChunk))

	// The bad holder is remembered: another fetch does not ask it.
	other := randomBytes(21, 3*testChunk)
	id2 := seed(t, other, bad)
	before := bad.metric(t, "p2ptrain_artifact_requests_served_total")
	err := fetcher.x.Fetch(fetchCtx(t, 5*time.Second), id2, bad.id())
	require.ErrorIs(t, err, ErrNoHolders)
	require.Equal(t, before, bad.metric(t, "p2ptrain_artifact_requests_served_total"))
}

// A holder that disappears mid-transfer: the fetch finishes from the others.
func TestFetchHolderVanishes(t *testing.T) {
	tests := []struct {
		name   string
		vanish func(c *cluster, fetcher, gone *testNode)
	}{
		{"host closed", func(c *cluster, _, gone *testNode) { gone.h.Close() }},
		{"unlinked and disconnected", func(c *cluster, fetcher, gone *testNode) {
			c.mn.UnlinkPeers(fetcher.id(), gone.id())
			c.mn.DisconnectPeers(fetcher.id(), gone.id())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, 3, mocknet.LinkOptions{}, ExchangeOptions{Window: 4})
			fetcher, stays, gone := c.nodes[0], c.nodes[1], c.nodes[2]
			data := randomBytes(22, 256*testChunk) // 1 MiB
			id := seed(t, data, stays, gone)
			c.throttle(fetcher, stays, 1<<20)
			c.throttle(fetcher, gone, 1<<20)

			errCh := make(chan error, 1)
			go func() { errCh <- fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id, stays.id(), gone.id()) }()
			eventually(t, 10*time.Second, func() bool {
				return gone.metric(t, "p2ptrain_artifact_sent_bytes_total") >= float64(len(data)/8)
			}, "vanishing holder served some chunks")
			tt.vanish(c, fetcher, gone)

			require.NoError(t, <-errCh)
			requireStored(t, fetcher, id, data)
			require.Less(t, gone.metric(t, "p2ptrain_artifact_sent_bytes_total"), float64(len(data)))
			require.Equal(t, 1.0, fetcher.metric(t, "p2ptrain_artifact_peer_drops_total", "outcome", peerGone))
		})
	}
}

// A holder that stops sending but keeps its stream open is dropped after the request
// timeout and its chunks are fetched from another holder.
func TestFetchHolderStalls(t *testing.T) {
	c := newCluster(t, 3, mocknet.LinkOptions{}, ExchangeOptions{Window: 4, RequestTimeout: 300 * time.Millisecond})
	fetcher, good, staller := c.nodes[0], c.nodes[1], c.nodes[2]
	data := randomBytes(23, 64*testChunk)
	id := seed(t, data, good, staller)
	m, err := staller.store.Manifest(id)
	require.NoError(t, err)
	mb, err := staller.store.ManifestBytes(id)
	require.NoError(t, err)
	var served atomic.Int32
	release := make(chan struct{})
	defer close(release)
	fakeHolder(t, staller, func(s network.Stream, r request) bool {
		if r.kind == reqManifest {
			frame := appendUvarint(nil, uint64(1+len(mb)))
			frame = append(append(frame, respManifest), mb...)
			_, err := s.Write(frame)
			return err == nil
		}
		for _, i := range r.indices {
			if served.Add(1) > 2 {
				<-release // hang without closing
				return false
			}
			b, e := m.ChunkRange(i)
			if writeChunkFrame(s, i, data[b:e]) != nil {
				return false
			}
		}
		return true
	})

	start := time.Now()
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id, staller.id(), good.id()))
	requireStored(t, fetcher, id, data)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, 1.0, fetcher.metric(t, "p2ptrain_artifact_peer_drops_total", "outcome", peerStalled))
}

// Manifest bytes that do not hash to the id are refused, naming peer and artifact.
func TestFetchForgedManifest(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
	fetcher, forger := c.nodes[0], c.nodes[1]
	real := seed(t, randomBytes(24, 5*testChunk), forger)
	forged := seed(t, randomBytes(25, 5*testChunk), forger)
	forgedBytes, err := forger.store.ManifestBytes(forged)
	require.NoError(t, err)
	fakeHolder(t, forger, func(s network.Stream, r request) bool {
		frame := appendUvarint(nil, uint64(1+len(forgedBytes)))
		frame = append(append(frame, respManifest), forgedBytes...)
		_, err := s.Write(frame)
		return err == nil
	})

	err = fetcher.x.Fetch(fetchCtx(t, 5*time.Second), real, forger.id())
	require.Error(t, err)
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, real.String())
	require.ErrorContains(t, err, forger.id().String())
	require.False(t, fetcher.store.Has(real))
	require.Equal(t, 1.0, fetcher.metric(t, "p2ptrain_artifact_peer_drops_total", "outcome", peerBadManifest))
}

// CIDs that cannot name an artifact are refused before any stream is opened.
func TestFetchRejectsNonArtifactCIDs(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
	fetcher, peer := c.nodes[0], c.nodes[1]
	streams := fakeHolder(t, peer, func(network.Stream, request) bool { return false })
	manifest := []byte{0xa0}
	sha512, err := cid.V1Builder{Codec: cids.CodecCBOR, MhType: mh.SHA2_512}.Sum(manifest)
	require.NoError(t, err)
	v0, err := cid.V0Builder{}.Sum(manifest)
	require.NoError(t, err)
	tests := []struct {
		name string
		id   cid.Cid
	}{
		{"raw codec", cids.Raw(manifest)},
		{"sha2-512", sha512},
		{"CIDv0", v0},
		{"undefined", cid.Undef},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := fetcher.x.Fetch(fetchCtx(t, time.Second), tt.id, peer.id())
			require.ErrorIs(t, err, cids.ErrBadCID)
		})
	}
	require.Zero(t, streams.Load(), "no stream may be opened for a bad CID")
}

func TestFetchNoHolder(t *testing.T) {
	missing := (&Manifest{Version: ManifestVersion, Size: 10, ChunkSize: testChunk, Chunks: []cid.Cid{ChunkCID([]byte("0123456789"))}}).ID()
	t.Run("connected peers lack it", func(t *testing.T) {
		c := newCluster(t, 3, mocknet.LinkOptions{}, ExchangeOptions{})
		start := time.Now()
		err := c.nodes[0].x.Fetch(fetchCtx(t, 5*time.Second), missing)
		require.ErrorIs(t, err, ErrNoHolders)
		require.ErrorContains(t, err, missing.String())
		require.Less(t, time.Since(start), time.Second, "a not-found answer must not wait for the deadline")
		require.Equal(t, 1.0, c.nodes[0].metric(t, "p2ptrain_artifact_fetches_total", "outcome", fetchNotFound))
	})
	t.Run("no peers at all", func(t *testing.T) {
		c := newCluster(t, 1, mocknet.LinkOptions{}, ExchangeOptions{})
		err := c.nodes[0].x.Fetch(fetchCtx(t, 5*time.Second), missing)
		require.ErrorIs(t, err, ErrNoHolders)
	})
	t.Run("silent peer until the deadline", func(t *testing.T) {
		c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
		release := make(chan struct{})
		defer close(release)
		fakeHolder(t, c.nodes[1], func(network.Stream, request) bool { <-release; return false })
		start := time.Now()
		err := c.nodes[0].x.Fetch(fetchCtx(t, 300*time.Millisecond), missing, c.nodes[1].id())
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, missing.String())
		require.Less(t, time.Since(start), 2*time.Second)
	})
}

// The stream handler answers malformed or unknown requests with a clear error frame
// and unknown artifacts with "not found", never with silence.
func TestServeAnswersBadRequests(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
	client, holder := c.nodes[0], c.nodes[1]
	id := seed(t, randomBytes(26, 3*testChunk), holder)
	unknown := seed(t, randomBytes(27, 10), client)
	idb := id.Bytes()
	frame := func(payload ...byte) []byte { return append(appendUvarint(nil, uint64(len(payload))), payload...) }
	withID := func(prefix []byte, id []byte, rest ...byte) []byte {
		p := append(append([]byte{}, prefix...), byte(len(id)))
		return frame(append(append(p, id...), rest...)...)
	}
	tests := []struct {
		name     string
		send     []byte
		wantKind byte
		wantCode int
	}{
		{"unknown version", frame(9, reqManifest), respError, codeVersion},
		{"unknown kind", frame(wireVersion, 0x7f), respError, codeUnknownKind},
		{"truncated", frame(wireVersion), respError, codeMalformed},
		{"not an artifact id", withID([]byte{wireVersion, reqManifest}, cids.Raw(nil).Bytes()), respError, codeMalformed},
		{"frame too large", appendUvarint(nil, maxRequestFrame+1), respError, codeMalformed},
		{"index out of range", withID([]byte{wireVersion, reqChunks}, idb, 1, 3), respError, codeBadIndex},
		{"zero chunks", withID([]byte{wireVersion, reqChunks}, idb, 0), respError, codeMalformed},
		{"unknown manifest", appendRequest(nil, request{kind: reqManifest, id: unknown}), respNotFound, 0},
		{"unknown chunks", appendRequest(nil, request{kind: reqChunks, id: unknown, indices: []int{0}}), respNotFound, 0},
		{"manifest", appendRequest(nil, request{kind: reqManifest, id: id}), respManifest, 0},
		{"chunk", appendRequest(nil, request{kind: reqChunks, id: id, indices: []int{2}}), respChunk, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := fetchCtx(t, 5*time.Second)
			s, err := client.h.NewStream(ctx, holder.id(), ProtocolID)
			require.NoError(t, err)
			defer s.Reset()
			_, err = s.Write(tt.send)
			require.NoError(t, err)
			resp, err := readResponse(bufio.NewReader(s), MaxManifestBytes+1)
			require.NoError(t, err)
			require.Equal(t, tt.wantKind, resp.kind, "response kind (error %d %q)", resp.code, resp.msg)
			require.Equal(t, tt.wantCode, resp.code, resp.msg)
			if resp.kind == respError {
				require.NotEmpty(t, resp.msg)
			}
		})
	}
}

// An interrupted fetch resumes: chunks already on disk are re-verified and only the
// rest is requested. A claimed chunk whose bytes rotted on disk is fetched again.
func TestFetchResumesAfterRestart(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{Window: 4})
	fetcher, holder := c.nodes[0], c.nodes[1]
	data := randomBytes(28, 256*testChunk)
	id := seed(t, data, holder)
	c.throttle(fetcher, holder, 2<<20)

	ctx, cancel := context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() { errCh <- fetcher.x.Fetch(ctx, id, holder.id()) }()
	eventually(t, 10*time.Second, func() bool {
		return fetcher.metric(t, "p2ptrain_artifact_received_bytes_total") >= float64(len(data)/3)
	}, "a third received")
	cancel()
	require.ErrorIs(t, <-errCh, context.Canceled)
	require.NoError(t, fetcher.x.Close()) // waits for the download to put its state away
	require.False(t, fetcher.store.Has(id))

	// Rot one chunk the bitmap claims.
	have, err := os.ReadFile(fetcher.store.partialPath(id, ".have"))
	require.NoError(t, err)
	require.NotZero(t, have[0]&1, "chunk 0 was written")
	f, err := os.OpenFile(fetcher.store.partialPath(id, ".data"), os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{data[0] ^ 0xff}, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	restarted := newTestNode(t, fetcher.h, fetcher.store.Dir(), ExchangeOptions{})
	require.NoError(t, restarted.x.Fetch(fetchCtx(t, 20*time.Second), id, holder.id()))
	requireStored(t, restarted, id, data)
	resumed := restarted.metric(t, "p2ptrain_artifact_resumed_bytes_total")
	received := restarted.metric(t, "p2ptrain_artifact_received_bytes_total")
	require.Positive(t, resumed)
	require.Less(t, resumed, float64(len(data)))
	require.Equal(t, float64(len(data)), resumed+received, "only the missing chunks were fetched")
}

// Cancelling and fetching again on the same exchange resumes too.
func TestFetchResumesAfterCancel(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{Window: 4})
	fetcher, holder := c.nodes[0], c.nodes[1]
	data := randomBytes(29, 256*testChunk)
	id := seed(t, data, holder)
	c.throttle(fetcher, holder, 2<<20)

	ctx, cancel := context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() { errCh <- fetcher.x.Fetch(ctx, id, holder.id()) }()
	eventually(t, 10*time.Second, func() bool {
		return fetcher.metric(t, "p2ptrain_artifact_received_bytes_total") >= float64(len(data)/2)
	}, "half received")
	cancel()
	require.ErrorIs(t, <-errCh, context.Canceled)

	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id, holder.id()))
	requireStored(t, fetcher, id, data)
	// What was received but not yet written when the first attempt stopped (a window
	// per stream, and the write queue) is not resumed and may come twice.
	slack := float64((4*2 + writeQueue) * testChunk)
	resumed := fetcher.metric(t, "p2ptrain_artifact_resumed_bytes_total")
	require.GreaterOrEqual(t, resumed, float64(len(data)/2)-slack)
	require.LessOrEqual(t, fetcher.metric(t, "p2ptrain_artifact_received_bytes_total"), float64(len(data))+slack)
}

func TestFetchErrorNamesArtifact(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
	missing := seed(t, randomBytes(30, 10), c.nodes[0])
	require.NoError(t, c.nodes[0].store.Remove(missing))
	err := c.nodes[0].x.Fetch(fetchCtx(t, 2*time.Second), missing, c.nodes[1].id())
	require.True(t, errors.Is(err, ErrNoHolders) && strings.Contains(err.Error(), missing.String()), "err = %v", err)
}

// A fetcher loses the full holder mid-transfer; a second later the holder is back (its
// node restarted). The other peer it fetches from is a partial holder, downloading slowly
// itself, that lacks most of what is left. The holder that left is asked again after
// retryLeft and the fetch completes. Before, a peer that had left was never asked again by
// that download, which then waited on the partial holder (two trainers did so for good,
// each partial for the other, in TestRestartedValidatorKeepsItsPaces; here the fetch ran
// out of its 25 s).
func TestFetchAsksAHolderAgainAfterItComesBack(t *testing.T) {
	c := newCluster(t, 3, mocknet.LinkOptions{}, ExchangeOptions{Window: 4})
	holder, fetcher, slow := c.nodes[0], c.nodes[1], c.nodes[2]
	data := randomBytes(31, 256*testChunk) // 1 MiB
	id := seed(t, data, holder)
	c.throttle(slow, holder, 16<<10) // 64 s for all of it
	c.throttle(fetcher, holder, 256<<10)

	go func() { _ = slow.x.Fetch(fetchCtx(t, 90*time.Second), id, holder.id()) }()
	eventually(t, 10*time.Second, func() bool {
		return slow.metric(t, "p2ptrain_artifact_received_bytes_total") >= 2*testChunk
	}, "the slow peer holds some chunks")
	done := make(chan error, 1)
	go func() { done <- fetcher.x.Fetch(fetchCtx(t, 25*time.Second), id, holder.id(), slow.id()) }()
	eventually(t, 10*time.Second, func() bool {
		return fetcher.metric(t, "p2ptrain_artifact_received_bytes_total") >= float64(len(data)/4)
	}, "the fetcher has a quarter")
	require.NoError(t, c.mn.UnlinkPeers(fetcher.id(), holder.id()))
	require.NoError(t, c.mn.DisconnectPeers(fetcher.id(), holder.id()))
	time.Sleep(time.Second)
	_, err := c.mn.LinkPeers(fetcher.id(), holder.id())
	require.NoError(t, err)
	c.throttle(fetcher, holder, 256<<10)
	_, err = c.mn.ConnectPeers(fetcher.id(), holder.id())
	require.NoError(t, err)
	require.NoError(t, <-done)
	requireStored(t, fetcher, id, data)
}

// A copy holder (Exchange.AddCopy: anyone can announce one) that stops sending is dropped
// after copyStall, not the request timeout (an hour here: without the bound the fetch
// would hang until its context ends), and is passed over for copies afterwards: the next
// download does not ask it.
func TestFetchCopyHolderStallsOnce(t *testing.T) {
	c := newCluster(t, 3, mocknet.LinkOptions{}, ExchangeOptions{Window: 4, RequestTimeout: time.Hour})
	fetcher, good, staller := c.nodes[0], c.nodes[1], c.nodes[2]
	data, other := randomBytes(24, 64*testChunk), randomBytes(25, 8*testChunk)
	id, otherID := seed(t, data, good, staller), seed(t, other, good, staller)
	var asked atomic.Int32
	release := make(chan struct{})
	defer close(release)
	fakeHolder(t, staller, func(network.Stream, request) bool {
		asked.Add(1)
		<-release // hang without closing, from the first request on
		return false
	})
	// The staller is announced (newer) before the good holder: it is asked first.
	fetcher.x.AddCopy(id, good.id())
	fetcher.x.AddCopy(id, staller.id())
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 30*time.Second), id))
	requireStored(t, fetcher, id, data)
	require.Positive(t, asked.Load(), "the staller was never asked: the test shows nothing")
	require.True(t, fetcher.x.book.isPassedOver(staller.id(), time.Now()), "the stalled copy holder is passed over")

	before := asked.Load()
	fetcher.x.AddCopy(otherID, good.id())
	fetcher.x.AddCopy(otherID, staller.id())
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 30*time.Second), otherID))
	requireStored(t, fetcher, otherID, other)
	require.Equal(t, before, asked.Load(), "the passed-over copy holder was asked again")
}
