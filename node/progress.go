package node

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
)

// printProgress writes one line per canonical head: round, train loss, held-out metrics
// (or that their evaluation failed), contributions and time since the previous head.
func printProgress(w io.Writer, rounds int, id cid.Cid, h *chain.Head, metrics map[string]float64, evalFailed bool, took time.Duration) {
	var b strings.Builder
	if rounds > 0 {
		fmt.Fprintf(&b, "round %3d/%d", h.Round, rounds)
	} else {
		fmt.Fprintf(&b, "round %3d", h.Round)
	}
	if h.Round == 0 {
		b.WriteString("  genesis          ")
	} else {
		fmt.Fprintf(&b, "  train-loss %.4f", h.Metrics.TrainLoss)
	}
	keys := make([]string, 0, len(metrics))
	for k := range metrics {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := metrics[k]
		if k == "accuracy" {
			fmt.Fprintf(&b, "  held-out %s %5.1f%%", k, 100*v)
		} else {
			fmt.Fprintf(&b, "  held-out %s %.4f", k, v)
		}
	}
	if evalFailed {
		b.WriteString("  held-out evaluation failed (see the proposer's log)")
	}
	if h.Round > 0 {
		fmt.Fprintf(&b, "  merged %d", len(h.Contributions))
		fmt.Fprintf(&b, "  %.1fs", took.Seconds())
	}
	fmt.Fprintf(&b, "  head %s\n", cids.Short(id.String()))
	io.WriteString(w, b.String())
}
