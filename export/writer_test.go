package export

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// TestWriterNeverBlocksAndLatestWins submits heads faster than they can be written: every
// Submit returns at once, and after Flush the directory holds the last one.
func TestWriterNeverBlocksAndLatestWins(t *testing.T) {
	st := newStores(t, t.TempDir(), 0)
	l := smallLayout()
	l[3].Shape = []int64{2048, 2048} // 16 MiB: slow enough that submissions pile up
	var ids []cid.Cid
	var parent cid.Cid
	vals := values(l, 1)
	for r := range uint64(12) {
		vals[r*100_000] += 1
		parent = st.putHead(t, l, vals, r, parent)
		ids = append(ids, parent)
	}
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	var reports []*Report
	dir := t.TempDir()
	w, err := NewWriter(WriterOptions{
		Dir: dir, Export: Options{InPlace: true, BlockBytes: 64 << 10},
		Artifacts: st.arts, Heads: st.heads, Registerer: reg,
		OnDone: func(r *Report, err error) {
			require.NoError(t, err)
			mu.Lock()
			reports = append(reports, r)
			mu.Unlock()
		},
	})
	require.NoError(t, err)
	var slowest time.Duration
	for _, id := range ids {
		start := time.Now()
		w.SubmitHead(id)
		slowest = max(slowest, time.Since(start))
		time.Sleep(5 * time.Millisecond) // some land while a write is in progress
	}
	require.Less(t, slowest, 50*time.Millisecond, "a submission never waits for the disk")
	require.NoError(t, w.Flush(context.Background()))

	last, err := OpenHead(st.arts, st.heads, ids[len(ids)-1])
	require.NoError(t, err)
	defer last.Close()
	dc, err := VerifyDir(dir, last, nil)
	require.NoError(t, err)
	require.Empty(t, dc.Notes, "the metadata names the last head")

	mu.Lock()
	written := len(reports)
	mu.Unlock()
	superseded := metricValue(t, w.m.superseded)
	t.Logf("%d submissions: %d written, %v superseded", len(ids), written, superseded)
	require.Equal(t, float64(len(ids)), float64(written)+superseded)
	require.Equal(t, float64(11), metricValue(t, w.m.lastRound))

	// The same head again is not rewritten.
	w.SubmitHead(ids[len(ids)-1])
	require.NoError(t, w.Flush(context.Background()))
	require.NoError(t, w.Close(context.Background()))
	require.Len(t, reports, written+1)
	require.Nil(t, reports[written], "nothing to do for the head the directory holds")
	require.NoError(t, w.Flush(context.Background()))
}

func TestWriterReportsErrorsAndCloses(t *testing.T) {
	st := newStores(t, t.TempDir(), 0)
	w, err := NewWriter(WriterOptions{Dir: t.TempDir(), Artifacts: st.arts, Heads: st.heads})
	require.NoError(t, err)
	w.SubmitHead(fakeCID("head", 1)) // not in the store
	err = w.Flush(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), fakeCID("head", 1).String())

	// A snapshot in memory works without stores.
	src := memSource(t, smallLayout(), 1, 2)
	w.Submit(src)
	require.NoError(t, w.Flush(context.Background()))
	require.NoError(t, w.Close(context.Background()))
	w.Submit(memSource(t, smallLayout(), 1, 3)) // dropped, with a warning
	require.NoError(t, w.Flush(context.Background()), "nothing is pending after Close")
}

func TestWriterCloseGivesUpWhenAsked(t *testing.T) {
	l := smallLayout()
	l[3].Shape = []int64{2048, 2048} // 16 MiB
	w, err := NewWriter(WriterOptions{Dir: t.TempDir()})
	require.NoError(t, err)
	for r := range uint64(3) {
		w.Submit(memSource(t, l, r, r))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	_ = w.Close(ctx) // may report the abandoned export's error
	require.Less(t, time.Since(start), 5*time.Second)
}

// metricValue reads a counter or gauge.
func metricValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	require.NoError(t, (<-ch).Write(&m))
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}
