package node

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/invite"
)

// A validator serves the experiment's record, signed by itself; a trainer serves none.
func TestValidatorServesTheExperimentRecord(t *testing.T) {
	c := newCluster(t, 1, 1, 2, 4)
	c.startAll()
	v, tr := c.nodes[0], c.nodes[1]
	var r *invite.Record
	require.Eventually(t, func() bool {
		var err error
		r, err = invite.Fetch(context.Background(), tr.host, v.host.ID())
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	j, err := invite.Verify(r, v.host.ID())
	require.NoError(t, err)
	require.Equal(t, v.cfg.Experiment.ID, j.Config.Experiment.ID)
	require.Equal(t, v.cfg.Experiment.Validators, j.Config.Experiment.Validators)
	require.Equal(t, v.cfg.Protocol, j.Config.Protocol)

	_, err = invite.Fetch(context.Background(), v.host, tr.host.ID())
	require.Error(t, err, "a trainer serves no record")
	c.waitDone(time.Minute)
}
