package export

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/internal/progress"
)

// An export shows the model files' bytes: written whole, or compared in place.
func TestExportShowsProgress(t *testing.T) {
	for _, tc := range []struct {
		name       string
		shardBytes int64
		inPlace    bool
	}{
		{"one file", 0, false},
		{"shards", 64 << 10, false},
		{"in place", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := memSource(t, smallLayout(), 1, 1)
			_, err := Export(ctx, src, dir, Options{ShardBytes: tc.shardBytes})
			require.NoError(t, err)

			next := withRound(src, 2)
			p, err := makePlan(next, norm(tc.shardBytes))
			require.NoError(t, err)
			changeBlocks(next, int64(len(p.files[0].header)), DefaultBlockBytes, 0.05, rand.New(rand.NewPCG(1, 1)))
			var size uint64
			for _, f := range p.files {
				size += uint64(f.size())
			}
			rec := &progress.Recorder{}
			_, err = Export(ctx, next, dir, Options{ShardBytes: tc.shardBytes, InPlace: tc.inPlace, Progress: rec})
			require.NoError(t, err)
			require.Equal(t, []progress.Recorded{{Name: fmt.Sprintf("exporting round 2 to %s", dir), Total: size, Done: size, Finished: true}}, rec.Tasks())
		})
	}
}
