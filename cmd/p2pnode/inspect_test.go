package main

import (
	"strings"
	"testing"

	"github.com/p2pnode/p2pnode/status"
	"github.com/stretchr/testify/require"
)

func TestStatusPrintsOverlap(t *testing.T) {
	cases := []struct {
		name    string
		overlap *status.OverlapStatus
		want    string // "": no overlap line
	}{
		{"without overlap", nil, ""},
		{"none ahead yet", &status.OverlapStatus{Windows: 1}, "overlap     0 of 1 windows trained ahead\n"},
		{"moved", &status.OverlapStatus{Windows: 5, Ahead: 4, LastMovedAt: 1, LastSteps: 20},
			"overlap     4 of 5 windows trained ahead; the last moved onto its head before step 2 of 20\n"},
		{"finished first", &status.OverlapStatus{Windows: 5, Ahead: 4, LastMovedAt: -1, LastSteps: 20},
			"overlap     4 of 5 windows trained ahead; the last finished before its head came\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			printStatus(&b, &status.Status{Peer: "p", Overlap: tc.overlap})
			var got string
			for _, l := range strings.SplitAfter(b.String(), "\n") {
				if strings.HasPrefix(l, "overlap") {
					got += l
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}
