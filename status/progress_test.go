package status

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
)

func TestProgressLine(t *testing.T) {
	id := cids.Record([]byte("head"))
	round := func(r uint64) *chain.Head {
		return &chain.Head{Round: r, Metrics: chain.Metrics{TrainLoss: 1.5}, Contributions: make([]chain.Contribution, 2)}
	}
	cases := []struct {
		name    string
		h       *chain.Head
		metrics map[string]float64
		failed  bool
		want    string
	}{
		{"genesis", round(0), map[string]float64{"loss": 2}, false, "round   0/5  genesis            held-out loss 2.0000  head "},
		{"metrics", round(3), map[string]float64{"loss": 1.25, "accuracy": 0.9}, false,
			"round   3/5  train-loss 1.5000  held-out accuracy  90.0%  held-out loss 1.2500  merged 2  4.0s  head "},
		{"none yet", round(3), nil, false, "round   3/5  train-loss 1.5000  merged 2  4.0s  head "},
		{"evaluation failed", round(3), nil, true,
			"round   3/5  train-loss 1.5000  held-out evaluation failed (see the proposer's log)  merged 2  4.0s  head "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			PrintProgress(&b, 5, id, tc.h, tc.metrics, tc.failed, 4*time.Second)
			require.Equal(t, tc.want+cids.Short(id.String())+"\n", b.String())
		})
	}
}
