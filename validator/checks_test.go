package validator

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
)

// TestHoldBack: a check of a proposal of the round holds a due takeover back, for one
// recomputation's bound at most, counted from the first time it held it back; a check of
// another round does not, and with no check the count starts over.
func TestHoldBack(t *testing.T) {
	const limit = time.Minute
	checking := func(round uint64) *checks {
		c := newChecks()
		c.running = &check{h: &chain.Head{Round: round}}
		return c
	}
	queued := newChecks()
	queued.running = &check{h: &chain.Head{Round: 7}}
	queued.queued = []*check{{h: &chain.Head{Round: 3}}}
	for _, tc := range []struct {
		name  string
		c     *checks
		since time.Duration // how long ago checks first held it back (0: never)
		want  bool
	}{
		{"no check", newChecks(), 0, false},
		{"no check resets the count", newChecks(), 2 * limit, false},
		{"a check of the round, first time", checking(3), 0, true},
		{"a check of the round, within the bound", checking(3), limit / 2, true},
		{"a check of the round, past the bound", checking(3), limit + time.Second, false},
		{"a check of another round", checking(4), 0, false},
		{"a queued check of the round", queued, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var since time.Time
			if tc.since > 0 {
				since = time.Now().Add(-tc.since)
			}
			require.Equal(t, tc.want, tc.c.holdBack(3, &since, limit))
			if !tc.c.busy(3) {
				require.True(t, since.IsZero(), "the count did not start over")
			} else {
				require.False(t, since.IsZero())
			}
		})
	}
}
