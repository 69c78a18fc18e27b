package artifact

import (
	"testing"
	"time"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/internal/progress"
)

func TestFetchShowsProgress(t *testing.T) {
	for _, tc := range []struct {
		name   string
		called string // progress.WithName's name; "" for none
		want   func(id string) string
	}{
		{"named by the caller", "fetching round 3's parameters", func(string) string { return "fetching round 3's parameters" }},
		{"unnamed", "", func(id string) string { return "fetching " + cids.Short(id) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &progress.Recorder{}
			c := newCluster(t, 2, mocknet.LinkOptions{}, ExchangeOptions{Progress: rec})
			fetcher, holder := c.nodes[0], c.nodes[1]
			size := 9*testChunk + 7
			data := randomBytes(3, size)
			id := seed(t, data, holder)
			ctx := fetchCtx(t, 10*time.Second)
			if tc.called != "" {
				ctx = progress.WithName(ctx, tc.called)
			}
			require.NoError(t, fetcher.x.Fetch(ctx, id, holder.id()))
			require.Equal(t, []progress.Recorded{{Name: tc.want(id.String()), Unit: progress.InBytes, Total: uint64(size), Done: uint64(size), Finished: true}},
				rec.Tasks())
		})
	}
}
