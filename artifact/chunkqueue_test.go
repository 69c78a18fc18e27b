package artifact

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestChunkQueue(t *testing.T) {
	have := func(i int) bool { return i == 1 } // resumed chunk
	q := newChunkQueue(6, have)
	q.addSessions(2)
	require.Equal(t, 5, q.left())

	// Fair share of what is left: 5 needed between 2 sessions gives 3, then 1 of 2.
	a, _ := q.take(nil, 8, nil)
	require.Equal(t, []int{0, 2, 3}, a)
	b, _ := q.take(nil, 8, nil)
	require.Equal(t, []int{4}, b)
	c, _ := q.take(nil, 8, nil)
	require.Equal(t, []int{5}, c)
	none, wait := q.take(nil, 8, nil)
	require.Empty(t, none)
	require.NotNil(t, wait)

	// A chunk given back wakes waiters and is handed out first; a session that lacks
	// it skips it.
	q.giveBack(3)
	<-wait
	skipped, _ := q.take(nil, 8, func(i int) bool { return i == 3 })
	require.Empty(t, skipped)
	again, _ := q.take(nil, 8, nil)
	require.Equal(t, []int{3}, again)

	for _, i := range []int{0, 2, 3, 4} {
		q.done(i)
	}
	select {
	case <-q.complete:
		t.Fatal("complete with a chunk missing")
	default:
	}
	q.done(5)
	q.done(5) // a duplicate is harmless
	<-q.complete
	require.Zero(t, q.left())
}
