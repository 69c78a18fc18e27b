package status

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

// PrintProgress writes one line per canonical head: round, train loss, held-out metrics
// (or that their evaluation failed), contributions and time since the previous head.
func PrintProgress(w io.Writer, rounds int, id cid.Cid, h *chain.Head, metrics map[string]float64, evalFailed bool, took time.Duration) {
	var b strings.Builder
	writeRound(&b, rounds, h.Round)
	if h.Round == 0 {
		b.WriteString("  genesis          ")
	} else {
		fmt.Fprintf(&b, "  train-loss %.4f", h.Metrics.TrainLoss)
	}
	writeHeldOut(&b, metrics, evalFailed)
	if h.Round > 0 {
		fmt.Fprintf(&b, "  merged %d", len(h.Contributions))
		fmt.Fprintf(&b, "  %.1fs", took.Seconds())
	}
	fmt.Fprintf(&b, "  head %s\n", cids.Short(id.String()))
	io.WriteString(w, b.String())
}

// PrintLateMetrics writes the held-out metrics of a round whose progress line went out
// before they came (its leader publishes a head before it evaluates it).
func PrintLateMetrics(w io.Writer, rounds int, p RoundPoint) {
	var b strings.Builder
	writeRound(&b, rounds, p.Round)
	writeHeldOut(&b, p.HeldOut, p.HeldOutFailed)
	fmt.Fprintf(&b, "  (came after the round's line)  head %s\n", cids.Short(p.Head))
	io.WriteString(w, b.String())
}

// writeHeldOut writes held-out metrics, sorted by name, or that their evaluation failed.
func writeHeldOut(b *strings.Builder, metrics map[string]float64, evalFailed bool) {
	keys := make([]string, 0, len(metrics))
	for k := range metrics {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := metrics[k]
		if k == "accuracy" {
			fmt.Fprintf(b, "  held-out %s %5.1f%%", k, 100*v)
		} else {
			fmt.Fprintf(b, "  held-out %s %.4f", k, v)
		}
	}
	if evalFailed {
		b.WriteString("  held-out evaluation failed (see the proposer's log)")
	}
}

// writeRound writes a progress line's round, out of rounds when the experiment has a limit.
func writeRound(b *strings.Builder, rounds int, round uint64) {
	if rounds > 0 {
		fmt.Fprintf(b, "round %3d/%d", round, rounds)
	} else {
		fmt.Fprintf(b, "round %3d", round)
	}
}
