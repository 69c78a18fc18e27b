package artifact

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/stretchr/testify/require"
)

func TestFetchFromOneHolder(t *testing.T) {
	tests := []struct {
		name string
		size int
	}{
		{"empty", 0},
		{"one byte", 1},
		{"one chunk", testChunk},
		{"chunks and a tail", 37*testChunk + 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
			fetcher, holder := c.nodes[0], c.nodes[1]
			data := randomBytes(uint64(tt.size), tt.size)
			id := seed(t, data, holder)

			require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id, holder.id()))
			requireStored(t, fetcher, id, data)
			require.Equal(t, 1.0, fetcher.metric(t, "p2ptrain_artifact_fetches_total", "outcome", fetchOK))
			require.Equal(t, float64(tt.size), fetcher.metric(t, "p2ptrain_artifact_received_bytes_total"))
			require.Equal(t, float64(tt.size), holder.metric(t, "p2ptrain_artifact_sent_bytes_total"))
			require.Equal(t, 1.0, fetcher.metric(t, "p2ptrain_artifact_fetch_duration_seconds"))
		})
	}
}

// Chunks must really come from every holder, not from whichever answered first.
// FetchAtMost downloads an artifact within its bound and refuses a larger one once the
// manifest says so, having received none of its chunks.
func TestFetchAtMostStopsAtTheManifest(t *testing.T) {
	size := 37*testChunk + 100
	tests := []struct {
		name string
		max  uint64
		ok   bool
	}{
		{"no bound", 0, true},
		{"exactly its size", uint64(size), true},
		{"above its size", uint64(size) + 1, true},
		{"one byte short", uint64(size) - 1, false},
		{"one chunk", testChunk, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
			fetcher, holder := c.nodes[0], c.nodes[1]
			data := randomBytes(7, size)
			id := seed(t, data, holder)
			// 0.5 s of transfer: the download is stopped long before it could end.
			c.throttle(fetcher, holder, float64(2*size))
			err := fetcher.x.FetchAtMost(fetchCtx(t, 10*time.Second), id, tt.max, holder.id())
			if tt.ok {
				require.NoError(t, err)
				requireStored(t, fetcher, id, data)
				return
			}
			require.ErrorIs(t, err, ErrTooLarge)
			require.ErrorContains(t, err, fmt.Sprintf("%d bytes, at most %d", size, tt.max))
			// The download stopped with its only caller: what the holder sends by the time
			// the whole artifact would have arrived is what was in flight when it stopped.
			time.Sleep(time.Second)
			require.False(t, fetcher.store.Has(id))
			require.Less(t, holder.metric(t, "p2ptrain_artifact_sent_bytes_total"), float64(size))
		})
	}
}

func TestFetchSpreadsOverHolders(t *testing.T) {
	c := newCluster(t, 5, mocknet.LinkOptions{}, ExchangeOptions{Window: 4})
	fetcher, holders := c.nodes[0], c.nodes[1:]
	data := randomBytes(5, 200*testChunk)
	id := seed(t, data, holders...)
	var hints []peer.ID
	for _, h := range holders {
		hints = append(hints, h.id())
	}
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id, hints...))
	requireStored(t, fetcher, id, data)
	var total float64
	for i, h := range holders {
		sent := h.metric(t, "p2ptrain_artifact_sent_bytes_total")
		require.Positive(t, sent, "holder %d served nothing", i)
		total += sent
	}
	require.Equal(t, float64(len(data)), total, "every chunk fetched once")
}

// Holders announced through AddHolder are used without hints, and a peer we are
// connected to that lacks the artifact is not needed.
func TestFetchUsesAnnouncedHolders(t *testing.T) {
	c := newCluster(t, 3, mocknet.LinkOptions{}, ExchangeOptions{})
	fetcher, holder, other := c.nodes[0], c.nodes[1], c.nodes[2]
	data := randomBytes(6, 10*testChunk)
	id := seed(t, data, holder)
	fetcher.x.AddHolder(id, holder.id())
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id))
	requireStored(t, fetcher, id, data)
	require.Zero(t, other.metric(t, "p2ptrain_artifact_requests_served_total"))
}

// Without hints or announcements, the connected peers are asked.
func TestFetchAsksConnectedPeers(t *testing.T) {
	c := newCluster(t, 4, mocknet.LinkOptions{}, ExchangeOptions{})
	fetcher, holder := c.nodes[0], c.nodes[3]
	data := randomBytes(7, 10*testChunk)
	id := seed(t, data, holder)
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, 10*time.Second), id))
	requireStored(t, fetcher, id, data)
}

func TestFetchPresentIsNoop(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
	fetcher, other := c.nodes[0], c.nodes[1]
	data := randomBytes(8, 3*testChunk)
	id := seed(t, data, fetcher)
	require.NoError(t, fetcher.x.Fetch(fetchCtx(t, time.Second), id, other.id()))
	require.Equal(t, 1.0, fetcher.metric(t, "p2ptrain_artifact_fetches_total", "outcome", fetchPresent))
	require.Zero(t, other.metric(t, "p2ptrain_artifact_requests_served_total"))
}

// Concurrent Fetch calls for one artifact share one download: the bytes come once.
func TestConcurrentFetchesShareOneDownload(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
	fetcher, holder := c.nodes[0], c.nodes[1]
	data := randomBytes(9, 64*testChunk)
	id := seed(t, data, holder)
	c.throttle(fetcher, holder, 1<<20) // ≈0.25 s, so the calls overlap
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id, holder.id())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	requireStored(t, fetcher, id, data)
	require.Equal(t, float64(len(data)), fetcher.metric(t, "p2ptrain_artifact_received_bytes_total"))
}

// One caller giving up does not stop the download another caller still waits for.
func TestFetchCallerLeavingKeepsSharedDownload(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
	fetcher, holder := c.nodes[0], c.nodes[1]
	data := randomBytes(10, 64*testChunk)
	id := seed(t, data, holder)
	c.throttle(fetcher, holder, 1<<20)
	impatient, cancel := context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() { errCh <- fetcher.x.Fetch(impatient, id, holder.id()) }()
	done := make(chan error, 1)
	go func() { done <- fetcher.x.Fetch(fetchCtx(t, 20*time.Second), id, holder.id()) }()
	eventually(t, 5*time.Second, func() bool {
		return fetcher.metric(t, "p2ptrain_artifact_received_bytes_total") > 0
	}, "download started")
	cancel()
	require.ErrorIs(t, <-errCh, context.Canceled)
	require.NoError(t, <-done)
	requireStored(t, fetcher, id, data)
}

func TestFetchAfterCloseFails(t *testing.T) {
	c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{})
	fetcher, holder := c.nodes[0], c.nodes[1]
	id := seed(t, randomBytes(11, 100), holder)
	require.NoError(t, fetcher.x.Close())
	err := fetcher.x.Fetch(fetchCtx(t, time.Second), id, holder.id())
	require.True(t, errors.Is(err, ErrClosed), "err = %v", err)
}

// A node still downloading an artifact serves the chunks it already holds, so a third
// node can start fetching from it before it is complete.
func TestFetchFromPartialHolder(t *testing.T) {
	c := newCluster(t, 3, mocknet.LinkOptions{}, ExchangeOptions{Window: 4})
	seedNode, middle, last := c.nodes[0], c.nodes[1], c.nodes[2]
	data := randomBytes(12, 256*testChunk) // 1 MiB
	id := seed(t, data, seedNode)
	c.throttle(middle, seedNode, 1<<20) // ≈1 s

	middleDone := make(chan error, 1)
	go func() { middleDone <- middle.x.Fetch(fetchCtx(t, 20*time.Second), id, seedNode.id()) }()
	eventually(t, 10*time.Second, func() bool {
		return middle.metric(t, "p2ptrain_artifact_received_bytes_total") >= float64(len(data)/4)
	}, "a quarter at the middle node")
	lastDone := make(chan error, 1)
	go func() { lastDone <- last.x.Fetch(fetchCtx(t, 20*time.Second), id, middle.id()) }()

	require.NoError(t, <-middleDone)
	servedWhilePartial := middle.metric(t, "p2ptrain_artifact_sent_bytes_total")
	require.NoError(t, <-lastDone)
	requireStored(t, last, id, data)
	require.Positive(t, servedWhilePartial, "the middle node served chunks before it was complete")
}
