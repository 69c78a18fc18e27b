package node

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/pyruntime"
)

// With protocol.overlap: eager every lease reserves its trainer's next microshards; a
// trainer that has published its update trains them at once, and the next round's leader
// leases them to it again, so it takes the window it trained ahead instead of training
// after the head. The chain is the one the validators agree on, every microshard is
// trained once, and the trainers' windows trained ahead are what got merged. A window
// still training when its lease comes is moved onto the lease's head: in the "moved" case
// the synthetic worker holds every window trained ahead before its first step until that
// happens, so each one taken was moved before step 0.
func TestMocknetOverlapTrainsAhead(t *testing.T) {
	cases := []struct {
		name, codec string
		validators  int // with three, the round's leader changes: it honours the reservations its predecessors granted
		moved       bool
	}{{"fp32", "fp32", 1, false}, {"sparse", "sparse", 3, false}, {"moved", "sparse", 1, true}}
	for _, tc := range cases {
		codec := tc.codec
		t.Run(tc.name, func(t *testing.T) {
			const rounds = 5
			c := newCluster(t, tc.validators, 3, rounds, 60)
			for _, n := range c.nodes {
				n.cfg.Protocol.Overlap = config.OverlapEager
				if codec == "sparse" {
					useSparse(n.cfg)
				}
				n.cfg.Lease.MinGroup = 3
				n.logs = &syncBuffer{}
				require.NoError(t, n.cfg.Validate())
				if tc.moved {
					n.rt.Hook = awaitShift
				}
			}
			c.startAll()
			c.waitDone(2 * time.Minute)
			heads := c.requireOneChain(c.nodes, rounds)
			merged := 0
			for _, h := range heads[1:] {
				merged += len(h.Contributions)
			}
			took := 0
			for _, n := range c.nodes[tc.validators:] {
				logs := n.logs.String()
				require.NotContains(t, logs, "window trained ahead failed", n.name)
				ahead := strings.Count(logs, "took the window trained ahead")
				took += ahead
				if tc.moved {
					require.Equal(t, ahead, strings.Count(logs, "moved_at_step=0 "), n.name)
				}
				// The status page counts the windows as the log does.
				st := n.n.Status()
				require.NotNil(t, st.Overlap, n.name)
				require.Equal(t, strings.Count(logs, `msg=trained `), st.Overlap.Windows, n.name)
				require.Equal(t, ahead, st.Overlap.Ahead, n.name)
				if tc.moved && ahead > 0 {
					require.Equal(t, 0, st.Overlap.LastMovedAt, n.name)
				}
				// The last round reserves nothing: no window is trained past the experiment.
				require.NotContains(t, logs, `msg="training ahead" round=`+strconv.Itoa(rounds+1)+" ", n.name)
			}
			t.Logf("%d windows trained ahead taken, %d contributions merged", took, merged)
			// Round 1's windows cannot be trained ahead (nothing was reserved before it);
			// in every later round a merged trainer had its reservation leased to it again.
			require.GreaterOrEqual(t, took, merged-len(heads[1].Contributions)-2,
				"%d windows trained ahead were taken of %d merged after round 1", took, merged-len(heads[1].Contributions))
		})
	}
}

// awaitShift holds a window trained ahead (a job with a shift path) before its first step
// until its shift request has come, or 20 s (a window that is dropped gets none).
func awaitShift(job pyruntime.TrainJob) error {
	if job.Shift == "" {
		return nil
	}
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(job.Shift); err == nil {
			return nil
		}
	}
	return nil
}
