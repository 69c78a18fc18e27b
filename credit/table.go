package credit

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable prints accounts as a table as of round, marking self's row, with a total.
func WriteTable(w io.Writer, accounts []Account, round uint64, self string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "peer\tmerged\tsamples\trejected\trounds\tquarantined\treasons rejected")
	var total Account
	for _, a := range accounts {
		name := a.Peer
		if a.Peer == self {
			name += " (this node)"
		}
		q := "-"
		switch {
		case a.QuarantinedAt(round):
			q = fmt.Sprintf("until round %d", a.QuarantinedUntil)
		case a.Quarantines > 0:
			q = fmt.Sprintf("%d× (until round %d)", a.Quarantines, a.QuarantinedUntil)
		}
		span := "-"
		if a.Merged+a.Rejections() > 0 {
			span = fmt.Sprintf("%d–%d", a.First, a.Last)
		}
		reasons := a.Reasons()
		if reasons == "" {
			reasons = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", name, a.Merged, a.Samples, a.Rejections(), span, q, reasons)
		total.Merged += a.Merged
		total.Samples += a.Samples
		total.Quarantines += a.Quarantines
		for r, n := range a.Rejected {
			if total.Rejected == nil {
				total.Rejected = map[string]int{}
			}
			total.Rejected[r] += n
		}
	}
	reasons := total.Reasons()
	if reasons == "" {
		reasons = "-"
	}
	fmt.Fprintf(tw, "%d peers, through round %d\t%d\t%d\t%d\t\t%d quarantines\t%s\n", len(accounts), round,
		total.Merged, total.Samples, total.Rejections(), total.Quarantines, reasons)
	return tw.Flush()
}
