package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/dataset"
	"github.com/p2pnode/p2pnode/internal/progress"
	"github.com/p2pnode/p2pnode/invite"
	"github.com/p2pnode/p2pnode/synth"
)

// A validator serves the experiment's record, signed by itself; a trainer serves none.
func TestValidatorServesTheExperimentRecord(t *testing.T) {
	c := newCluster(t, 1, 1, 2, 4)
	work := &progress.Recorder{}
	c.nodes[1].work = work
	c.startAll()
	v, tr := c.nodes[0], c.nodes[1]
	var r *invite.Record
	var sizes *invite.Sizes
	require.Eventually(t, func() bool {
		var err error
		r, sizes, err = invite.Fetch(context.Background(), tr.host, v.host.ID())
		return err == nil && sizes != nil && sizes.ParamsBytes > 0
	}, 10*time.Second, 20*time.Millisecond)
	// The sizes are those of the synthetic model's pack and of the dataset's manifest.
	require.Equal(t, synth.Layout().Params(), sizes.Params)
	require.Greater(t, sizes.ParamsBytes, uint64(4*sizes.Params), "a pack is its float32 values and a header")
	m, err := dataset.Load(v.cfg.Dataset.Manifest)
	require.NoError(t, err)
	var total uint64
	for _, f := range m.Files {
		total += uint64(f.Bytes)
	}
	require.Equal(t, uint64(len(m.Files)), sizes.DatasetFiles)
	require.Equal(t, total, sizes.DatasetBytes)
	j, err := invite.Verify(r, v.host.ID())
	require.NoError(t, err)
	require.Equal(t, v.cfg.Experiment.ID, j.Config.Experiment.ID)
	require.Equal(t, v.cfg.Experiment.Validators, j.Config.Experiment.Validators)
	require.Equal(t, v.cfg.Protocol, j.Config.Protocol)

	_, _, err = invite.Fetch(context.Background(), v.host, tr.host.ID())
	require.Error(t, err, "a trainer serves no record")
	c.waitDone(time.Minute)

	// The trainer was shown the heads' parameters it fetched, whole.
	var params int
	for _, k := range work.Tasks() {
		if strings.HasSuffix(k.Name, "'s parameters") {
			params++
			require.True(t, strings.HasPrefix(k.Name, "fetching round "), k.Name)
			require.Equal(t, k.Total, k.Done, k.Name)
			require.True(t, k.Finished, k.Name)
			require.NoError(t, k.Err, k.Name)
		}
	}
	require.Positive(t, params)
}
