package node

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
)

// With protocol.overlap: eager every lease reserves its trainer's next microshards; a
// trainer that has published its update trains them at once, and the next round's leader
// leases them to it again, so it takes the window it trained ahead instead of training
// after the head. The chain is the one the validators agree on, every microshard is
// trained once, and the trainers' windows trained ahead are what got merged.
func TestMocknetOverlapTrainsAhead(t *testing.T) {
	cases := []struct {
		codec      string
		validators int // with three, the round's leader changes: it honours the reservations its predecessors granted
	}{{"fp32", 1}, {"sparse", 3}}
	for _, tc := range cases {
		codec := tc.codec
		t.Run(codec, func(t *testing.T) {
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
				took += strings.Count(logs, "took the window trained ahead")
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
